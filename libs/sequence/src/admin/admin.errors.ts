/** What the admin API answers with an error status: `{ error: code, message }`. */
export type AdminErrorCode =
  | 'bad-request'
  | 'forbidden'
  | 'mutations-disabled'
  | 'not-found'
  | 'conflict'
  | 'too-large'
  | 'unsupported'
  | 'internal'
  | 'unavailable';

const STATUS: Readonly<Record<AdminErrorCode, number>> = {
  'bad-request': 400,
  forbidden: 403,
  'mutations-disabled': 403,
  'not-found': 404,
  conflict: 409,
  'too-large': 413,
  unsupported: 501,
  internal: 500,
  unavailable: 503,
};

/** An admin request that cannot be answered as asked; the filter turns it into its status. */
export class AdminRequestError extends Error {
  override readonly name = 'AdminRequestError';
  readonly status: number;

  constructor(
    readonly code: AdminErrorCode,
    message: string,
  ) {
    super(message);
    this.status = STATUS[code];
  }
}

export function badRequest(message: string): AdminRequestError {
  return new AdminRequestError('bad-request', message);
}

export function notFound(message: string): AdminRequestError {
  return new AdminRequestError('not-found', message);
}

export function unsupported(message: string): AdminRequestError {
  return new AdminRequestError('unsupported', message);
}

export function conflict(message: string): AdminRequestError {
  return new AdminRequestError('conflict', message);
}
