import { Get, Param, Req, Res, UseFilters, UseGuards } from '@nestjs/common';
import { AdminAccessGuard } from '../admin-access.guard';
import { AdminErrorFilter } from '../admin-error.filter';
import { AdminRequestError } from '../admin.errors';
import {
  CONSOLE_INDEX,
  CONSOLE_SECURITY_HEADERS,
  loadConsoleFiles,
  type ConsoleFile,
} from './console-page';

/** What the controller reads of a request (Express's, the platform the console runs on). */
interface PageRequest {
  readonly url: string;
  readonly originalUrl?: string;
  readonly headers: Readonly<Record<string, string | string[] | undefined>>;
}

/** What it writes to a response (Express's). */
interface PageResponse {
  status(code: number): PageResponse;
  setHeader(name: string, value: string): unknown;
  end(body?: Buffer | string): unknown;
}

/**
 * Serves the operator console: the page at the admin path (`/sequence-admin/`) and its stylesheet
 * and modules beside it, from the files read once at startup. The page finds the API relative to
 * its own address (`api/…`), so it works under any path and behind a proxy that adds a prefix.
 * Mounted by SequenceAdminModule at its path, behind the same guard as the API.
 */
@UseGuards(AdminAccessGuard)
@UseFilters(AdminErrorFilter)
export class ConsolePageController {
  private readonly files = loadConsoleFiles();

  @Get()
  page(@Req() request: PageRequest, @Res() response: PageResponse): void {
    const path = (request.originalUrl ?? request.url).split('?')[0];
    if (!path.endsWith('/')) {
      // The page's relative links need the trailing slash: /sequence-admin → /sequence-admin/.
      const last = path.slice(path.lastIndexOf('/') + 1);
      response.status(308).setHeader('location', `${last}/`);
      response.end();
      return;
    }
    this.send(this.files.get(CONSOLE_INDEX)!, request, response);
  }

  @Get(':file')
  file(
    @Param('file') name: string,
    @Req() request: PageRequest,
    @Res() response: PageResponse,
  ): void {
    const file = name === CONSOLE_INDEX ? undefined : this.files.get(name);
    if (!file) throw new AdminRequestError('not-found', `the console has no file ${name}`);
    this.send(file, request, response);
  }

  private send(file: ConsoleFile, request: PageRequest, response: PageResponse): void {
    for (const [name, value] of Object.entries(CONSOLE_SECURITY_HEADERS)) {
      response.setHeader(name, value);
    }
    response.setHeader('etag', file.etag);
    if (request.headers['if-none-match'] === file.etag) {
      response.status(304).end();
      return;
    }
    response.status(200).setHeader('content-type', file.contentType);
    response.end(file.body);
  }
}
