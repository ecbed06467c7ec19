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

const CODE_BY_STATUS: Readonly<Record<number, AdminErrorCode>> = {
  400: 'bad-request',
  401: 'forbidden',
  403: 'forbidden',
  404: 'not-found',
  413: 'too-large',
  501: 'unsupported',
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
    this.adapterHost.httpAdapter.reply(response, body, status);
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
    this.logger.error(`an admin request failed: ${errorMessage(exception)}`);
    return { status: 500, body: { error: 'internal', message: errorMessage(exception) } };
  }
}
