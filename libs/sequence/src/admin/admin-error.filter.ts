import {
  type ArgumentsHost,
  Catch,
  type ExceptionFilter,
  HttpException,
  Logger,
} from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import { errorMessage } from '../core/errors/caught';
import { AdminRequestError, type AdminErrorCode } from './admin.errors';
import { isUnavailable } from './unavailable';

/** Seconds a client is asked to wait (`Retry-After`) before trying a 503 again. */
const RETRY_AFTER_SECONDS = 5;

const CODE_BY_STATUS: Readonly<Record<number, AdminErrorCode>> = {
  400: 'bad-request',
  401: 'forbidden',
  403: 'forbidden',
  404: 'not-found',
  409: 'conflict',
  413: 'too-large',
  501: 'unsupported',
  503: 'unavailable',
};

/** The admin error code of an HTTP status. */
export function codeOfStatus(status: number): AdminErrorCode {
  return CODE_BY_STATUS[status] ?? (status >= 500 ? 'internal' : 'bad-request');
}

/** Every admin error as JSON `{ error: <code>, message }` with its status. */
@Catch()
export class AdminErrorFilter implements ExceptionFilter {
  private readonly logger = new Logger('SequenceAdmin');

  constructor(private readonly adapterHost: HttpAdapterHost) {}

  catch(exception: unknown, host: ArgumentsHost): void {
    const { status, body } = this.describe(exception);
    const response: unknown = host.switchToHttp().getResponse();
    const adapter = this.adapterHost.httpAdapter;
    if (status === 503) adapter.setHeader(response, 'Retry-After', String(RETRY_AFTER_SECONDS));
    adapter.reply(response, body, status);
  }

  private describe(exception: unknown): {
    status: number;
    body: { error: AdminErrorCode; message: string };
  } {
    if (exception instanceof AdminRequestError) {
      return {
        status: exception.status,
        body: { error: exception.code, message: exception.message },
      };
    }
    if (exception instanceof HttpException) {
      const status = exception.getStatus();
      return { status, body: { error: codeOfStatus(status), message: exception.message } };
    }
    if (isUnavailable(exception)) {
      // A store or the broker cannot be reached now: worth trying again, not a bug.
      this.logger.warn(
        `an admin request found a store or the broker unavailable: ${errorMessage(exception)}`,
      );
      return { status: 503, body: { error: 'unavailable', message: errorMessage(exception) } };
    }
    this.logger.error(`an admin request failed: ${errorMessage(exception)}`);
    return { status: 500, body: { error: 'internal', message: errorMessage(exception) } };
  }
}
