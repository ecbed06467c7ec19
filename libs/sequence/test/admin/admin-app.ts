import type { AddressInfo } from 'node:net';
import type { CanActivate, INestApplication, Provider } from '@nestjs/common';
import type { NestExpressApplication } from '@nestjs/platform-express';
import { Test } from '@nestjs/testing';
import { SequenceModule, type SequenceModuleOptions } from 'nest-sequence';
import {
  SequenceAdminModule,
  type SequenceAdminFactoryOptions,
  type SequenceAdminOptions,
} from 'nest-sequence/admin';

/** An HTTP answer: status and parsed JSON body. */
export interface Answer<T = Record<string, unknown>> {
  readonly status: number;
  readonly body: T;
}

export interface AdminApp {
  readonly app: INestApplication;
  /** `http://127.0.0.1:<port>/<path>/api` */
  readonly api: string;
  get<T = Record<string, unknown>>(route: string): Promise<Answer<T>>;
  post<T = Record<string, unknown>>(route: string, body?: unknown): Promise<Answer<T>>;
  /** A POST of a raw body with headers of its own (no console header added). */
  postRaw<T = Record<string, unknown>>(
    route: string,
    body: string,
    headers: Record<string, string>,
  ): Promise<Answer<T>>;
  /** A GET with headers of its own (what a guard may read). */
  getWith<T = Record<string, unknown>>(
    route: string,
    headers: Record<string, string>,
  ): Promise<Answer<T>>;
  close(): Promise<void>;
}

export interface AdminAppOptions {
  readonly sequence?: SequenceModuleOptions;
  readonly admin?: SequenceAdminOptions;
  /** Registers the console with forRootAsync instead: the path given, the rest from `factory`. */
  readonly async?: {
    readonly path: string;
    readonly guard?: SequenceAdminOptions['guard'];
    readonly imports?: SequenceAdminOptions['imports'];
    readonly factory: () => Promise<SequenceAdminFactoryOptions>;
  };
  readonly providers?: Provider[];
  /** Sets the application up before it starts (its body parser, say), as a `main.ts` would. */
  readonly configure?: (app: NestExpressApplication) => void;
}

/**
 * A real HTTP application: SequenceModule (global) and SequenceAdminModule, listening on an
 * ephemeral port of 127.0.0.1; requests go through `fetch`.
 */
export async function createAdminApp(options: AdminAppOptions = {}): Promise<AdminApp> {
  const moduleRef = await Test.createTestingModule({
    imports: [
      SequenceModule.forRoot({
        isGlobal: true,
        ...options.sequence,
        tuning: { sweepers: { expiry: { intervalMs: false } }, ...options.sequence?.tuning },
      }),
      options.async
        ? SequenceAdminModule.forRootAsync({
            path: options.async.path,
            guard: options.async.guard,
            imports: options.async.imports,
            useFactory: options.async.factory,
          })
        : SequenceAdminModule.forRoot(options.admin),
    ],
    providers: options.providers ?? [],
  }).compile();
  const app = moduleRef.createNestApplication<NestExpressApplication>({ logger: false });
  options.configure?.(app);
  await app.listen(0, '127.0.0.1');
  const { port } = app.getHttpServer().address() as AddressInfo;
  const path = options.async?.path ?? options.admin?.path ?? 'sequence-admin';
  const api = `http://127.0.0.1:${port}/${path}/api`;
  const call = async <T>(
    method: string,
    route: string,
    body?: unknown,
    headers: Record<string, string> = {},
  ): Promise<Answer<T>> => {
    const response = await fetch(`${api}/${route}`, {
      method,
      headers:
        body === undefined
          ? headers
          : { 'content-type': 'application/json', 'x-sequence-admin': '1', ...headers },
      body: body === undefined || typeof body === 'string' ? body : JSON.stringify(body),
    });
    return { status: response.status, body: (await response.json()) as T };
  };
  return {
    app,
    api,
    get: (route) => call('GET', route),
    post: (route, body) => call('POST', route, body ?? {}),
    postRaw: async (route, body, headers) => {
      const response = await fetch(`${api}/${route}`, { method: 'POST', headers, body });
      return { status: response.status, body: (await response.json()) as never };
    },
    getWith: (route, headers) => call('GET', route, undefined, headers),
    close: () => app.close(),
  };
}

/** A guard that lets requests in when `allow` is true, naming the actor on `request.user`. */
export class SwitchGuard implements CanActivate {
  allow = true;
  canActivate(context: Parameters<CanActivate['canActivate']>[0]): boolean {
    const request = context.switchToHttp().getRequest<{ user?: unknown }>();
    request.user = { id: 'operator-1' };
    return this.allow;
  }
}
