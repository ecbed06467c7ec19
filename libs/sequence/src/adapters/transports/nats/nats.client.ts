import * as transportNode from '@nats-io/transport-node';

/*
 * `@nats-io/*` 3.x declare their core types in `@nats-io/nats-core/internal`, a package subpath
 * that TypeScript's node10 resolution (`moduleResolution: node`, this library's) does not follow.
 * The few shapes this transport uses are declared here, against the client's documented API.
 */

/** The server's INFO, as far as the transport reads it. */
export interface NatsServerInfo {
  readonly max_payload: number;
}

/** A connection status event. */
export interface NatsStatus {
  readonly type: string;
}

/** The part of `NatsConnection` the transport uses. */
export interface NatsConnection {
  readonly info?: NatsServerInfo;
  flush(): Promise<void>;
  rtt(): Promise<number>;
  drain(): Promise<void>;
  close(): Promise<void>;
  isClosed(): boolean;
  /** Status events; `stop()` (the client's QueuedIterator has it) ends them and drops the listener. */
  status(): AsyncIterable<NatsStatus> & { stop?(): void };
  /** A core NATS publish (no JetStream, no confirm). */
  publish(subject: string, payload?: Uint8Array | string): void;
  /** A core NATS subscription whose messages go to `callback`. */
  subscribe(
    subject: string,
    options: { callback: (error: Error | null, message: unknown) => void },
  ): { unsubscribe(): void };
}

/** NATS message headers (`MsgHdrs`). */
export interface NatsHeaders extends Iterable<[string, string[]]> {
  append(name: string, value: string): void;
}

/** Connection options of `@nats-io/transport-node`'s `connect` (see its documentation). */
export type NatsConnectionOptions = transportNode.NodeConnectionOptions & {
  readonly servers?: string | string[];
  readonly maxReconnectAttempts?: number;
  readonly reconnectTimeWait?: number;
  readonly name?: string;
};

const client = transportNode as unknown as {
  connect(options: NatsConnectionOptions): Promise<NatsConnection>;
  headers(): NatsHeaders;
};

export const connectNats = (options: NatsConnectionOptions): Promise<NatsConnection> =>
  client.connect(options);
export const natsHeaders = (): NatsHeaders => client.headers();

/** Milliseconds as the nanoseconds JetStream's configuration takes. */
export function nanos(ms: number): number {
  return ms * 1_000_000;
}
