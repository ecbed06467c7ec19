import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { CanActivate, INestApplication, Provider } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { SequenceModule, type SequenceModuleOptions } from 'nest-sequence';
import { SequenceAdminModule, type SequenceAdminOptions } from 'nest-sequence/admin';

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
  close(): Promise<void>;
}

export interface AdminAppOptions {
  readonly sequence?: SequenceModuleOptions;
  readonly admin?: SequenceAdminOptions;
  readonly providers?: Provider[];
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
      SequenceAdminModule.forRoot(options.admin),
    ],
    providers: options.providers ?? [],
  }).compile();
  const app = moduleRef.createNestApplication({ logger: false });
  await app.listen(0, '127.0.0.1');
  const { port } = (app.getHttpServer() as Server).address() as AddressInfo;
  const api = `http://127.0.0.1:${port}/${options.admin?.path ?? 'sequence-admin'}/api`;
  const call = async <T>(method: string, route: string, body?: unknown): Promise<Answer<T>> => {
    const response = await fetch(`${api}/${route}`, {
      method,
      headers: body === undefined ? {} : { 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    return { status: response.status, body: (await response.json()) as T };
  };
  return {
    app,
    api,
    get: (route) => call('GET', route),
    post: (route, body) => call('POST', route, body ?? {}),
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
