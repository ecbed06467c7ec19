import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import {
  Inject,
  Injectable,
  Module,
  type OnApplicationBootstrap,
  type OnApplicationShutdown,
} from '@nestjs/common';
import { SEQUENCE_METRICS_REGISTRY } from 'nest-sequence';
import type { Registry } from 'prom-client';
import { DemoEnvironmentError } from './demo-environment.error';

/** Where `METRICS_PORT` (and `METRICS_HOST`) ask the demo to serve its metrics. */
export interface MetricsEndpointSettings {
  /** `METRICS_PORT`; 0 picks a free port (printed). */
  readonly port: number;
  /** `METRICS_HOST`: the address to listen on. @default 127.0.0.1 */
  readonly host: string;
}

const MAX_PORT = 65_535;
/** A host name or an IPv4 / IPv6 address: nothing that could not be one. */
const HOST = /^[A-Za-z0-9.:-]{1,253}$/;

/** The problems with `METRICS_PORT` and `METRICS_HOST`, as `[variable, what is wrong]`. */
export function metricsEndpointProblems(env: NodeJS.ProcessEnv): [string, string][] {
  const problems: [string, string][] = [];
  const port = env.METRICS_PORT;
  if (port !== undefined && port !== '' && !(/^\d+$/.test(port) && Number(port) <= MAX_PORT)) {
    problems.push([
      'METRICS_PORT',
      `must be a port number from 0 to ${MAX_PORT} (0 picks a free one), got ${JSON.stringify(port)}`,
    ]);
  }
  const host = env.METRICS_HOST;
  if (host !== undefined && host !== '' && !HOST.test(host)) {
    problems.push([
      'METRICS_HOST',
      `must be an address to listen on (e.g. 127.0.0.1, or 0.0.0.0 for a Prometheus in a ` +
        `container), got ${JSON.stringify(host)}`,
    ]);
  }
  return problems;
}

/**
 * `METRICS_PORT` and `METRICS_HOST`, checked; undefined when `METRICS_PORT` is unset (no
 * endpoint).
 * @throws DemoEnvironmentError naming the variable that is wrong
 */
export function readMetricsEndpoint(
  env: NodeJS.ProcessEnv = process.env,
): MetricsEndpointSettings | undefined {
  const problems = metricsEndpointProblems(env);
  if (problems.length > 0) {
    throw new DemoEnvironmentError(
      problems.map(([variable]) => variable),
      problems.map(([variable, text]) => `${variable} ${text}`),
    );
  }
  if (env.METRICS_PORT === undefined || env.METRICS_PORT === '') return undefined;
  return { port: Number(env.METRICS_PORT), host: env.METRICS_HOST || '127.0.0.1' };
}

/**
 * With `METRICS_PORT` set, serves the module's prom-client registry (`SEQUENCE_METRICS_REGISTRY`)
 * in Prometheus's text format at `http://<METRICS_HOST>:<METRICS_PORT>/metrics`, from bootstrap
 * to shutdown: what the `observability` profile of docker-compose.yml scrapes. It is a plain
 * Node HTTP server, apart from any HTTP API of the demo, so that every demo has the same one.
 */
@Injectable()
export class MetricsEndpoint implements OnApplicationBootstrap, OnApplicationShutdown {
  private server: Server | undefined;

  constructor(@Inject(SEQUENCE_METRICS_REGISTRY) private readonly registry: Registry) {}

  async onApplicationBootstrap(): Promise<void> {
    const settings = readMetricsEndpoint();
    if (!settings) return;
    const server = createServer((request, response) => {
      if (request.method !== 'GET' || request.url?.split('?')[0] !== '/metrics') {
        response.writeHead(404, { 'content-type': 'text/plain' }).end('not found: try /metrics\n');
        return;
      }
      this.registry.metrics().then(
        (text) => response.writeHead(200, { 'content-type': this.registry.contentType }).end(text),
        (error: unknown) =>
          response.writeHead(500, { 'content-type': 'text/plain' }).end(`${String(error)}\n`),
      );
    });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(settings.port, settings.host, () => resolve());
    });
    this.server = server;
    // stderr: the producer's stdout carries its receipt alone.
    console.error(`metrics on ${this.url()}`);
  }

  /** The endpoint's URL, once it listens. */
  url(): string | undefined {
    const address = this.server?.address() as AddressInfo | null | undefined;
    if (!address) return undefined;
    const host = address.family === 'IPv6' ? `[${address.address}]` : address.address;
    return `http://${host}:${address.port}/metrics`;
  }

  async onApplicationShutdown(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    if (!server) return;
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}

/** Import in a demo's root module: the endpoint, when `METRICS_PORT` asks for it. */
@Module({ providers: [MetricsEndpoint] })
export class MetricsEndpointModule {}
