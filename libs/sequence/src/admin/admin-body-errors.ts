import { Inject, Injectable, type OnModuleInit } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import { codeOfStatus } from './admin-error.filter';
import { ADMIN_OPTIONS, type ResolvedAdminOptions } from './admin.options';

/** What the body parser fails a request with: an http-errors client error (body-parser's). */
interface BodyError {
  readonly status?: unknown;
  readonly expose?: unknown;
  readonly message?: unknown;
  /** body-parser's: the byte limit, and the body's declared length. */
  readonly limit?: unknown;
  readonly length?: unknown;
}

interface AdminRequest {
  readonly originalUrl?: string;
  readonly url?: string;
}

/**
 * Answers the errors of reading an admin API request's body (JSON the application's body parser
 * refused: larger than its limit, malformed), and of decoding its path parameters (malformed
 * percent-encoding), as `{ error, message }`, as every other admin error.
 * The body parser is the application's and runs before any route, and the router decodes the
 * parameters before the route is entered, so these errors never reach the admin routes' filter: an Express error handler for the admin API's path answers them,
 * registered after the routes and before Nest's own error handler. Every other error, and every
 * error of another path, goes on to the application's handling untouched.
 */
@Injectable()
export class AdminBodyErrors implements OnModuleInit {
  constructor(
    private readonly adapterHost: HttpAdapterHost,
    @Inject(ADMIN_OPTIONS) private readonly options: ResolvedAdminOptions,
  ) {}

  onModuleInit(): void {
    const adapter = this.adapterHost.httpAdapter;
    // An application context without HTTP, or another platform than the console's (Express).
    if (!adapter || adapter.getType() !== 'express') return;
    // The API's path after whatever global prefix the application set (not known to a module).
    const api = new RegExp(`(^|/)${this.options.path.replace(/\./g, '\\.')}/api(/|$)`, 'i');
    adapter.use(
      (
        error: BodyError,
        request: AdminRequest,
        response: unknown,
        next: (error: unknown) => void,
      ) => {
        const status = typeof error?.status === 'number' ? error.status : 0;
        const path = (request.originalUrl ?? request.url ?? '').split('?')[0];
        // A path parameter that is not valid percent-encoding: the router's URIError, its
        // message naming the parameter, not marked `expose` as http-errors would mark it.
        const exposed = error.expose === true || error instanceof URIError;
        if (status < 400 || status > 499 || !exposed || !api.test(path)) {
          next(error);
          return;
        }
        adapter.reply(
          response,
          { error: codeOfStatus(status), message: messageOf(error, status) },
          status,
        );
      },
    );
  }
}

function messageOf(error: BodyError, status: number): string {
  if (status !== 413) return String(error.message);
  const length = typeof error.length === 'number' ? ` (${error.length} bytes)` : '';
  const limit = typeof error.limit === 'number' ? ` of ${error.limit} bytes` : '';
  return (
    `the request body${length} is larger than this application's JSON body limit${limit}: ` +
    "send fewer ids per request, or raise the limit (app.useBodyParser('json', { limit: '1mb' }))"
  );
}
