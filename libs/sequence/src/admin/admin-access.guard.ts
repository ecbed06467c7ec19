import {
  type CanActivate,
  type ExecutionContext,
  Inject,
  Injectable,
  Logger,
  type OnModuleInit,
  Optional,
  SetMetadata,
} from '@nestjs/common';
import { Reflector } from '@nestjs/core';
import { isObservable, lastValueFrom } from 'rxjs';
import { AdminRequestError } from './admin.errors';
import { ADMIN_GUARD, ADMIN_OPTIONS, type ResolvedAdminOptions } from './admin.options';
import { isLoopbackAddress, isLoopbackHost } from './loopback';

const MUTATION = 'nest-sequence:admin-mutation';

/** Marks a route that changes something: refused unless `mutations: true`. */
export const AdminMutation = (): MethodDecorator => SetMetadata(MUTATION, true);

interface HttpRequest {
  readonly socket?: { readonly remoteAddress?: string };
  readonly headers?: Readonly<Record<string, string | string[] | undefined>>;
}

/** The header the console page adds to every action: a cross-site form or link cannot send it. */
export const ADMIN_REQUEST_HEADER = 'x-sequence-admin';

/** Headers a proxy adds: with them, the socket's address is the proxy's, not the client's. */
const FORWARDING = ['forwarded', 'x-forwarded-for', 'x-real-ip'] as const;

/**
 * With no guard, warns at start when actions are on: loopback-only access holds against clients
 * that reach the socket themselves, not against a proxy on the same host that adds no forwarding
 * header (nginx's `proxy_pass` adds none by default, and sends the upstream's address as `Host`).
 */
@Injectable()
export class UnguardedActionsWarning implements OnModuleInit {
  private readonly logger = new Logger('SequenceAdminModule');

  constructor(@Inject(ADMIN_OPTIONS) private readonly options: ResolvedAdminOptions) {}

  onModuleInit(): void {
    if (!this.options.mutations) return;
    this.logger.warn(
      `the console at /${this.options.path} takes actions (mutations: true) with no guard: it ` +
        'answers loopback clients only, which a proxy on the same host that adds no ' +
        'Forwarded, X-Forwarded-For or X-Real-IP header (nginx by default) lets anyone through; ' +
        'give SequenceAdminModule a guard',
    );
  }
}

/**
 * Every admin route passes here: the app's guard decides who may come in (with none, only
 * loopback clients), then routes that change something are refused while mutations are off.
 */
@Injectable()
export class AdminAccessGuard implements CanActivate {
  constructor(
    @Inject(ADMIN_OPTIONS) private readonly options: ResolvedAdminOptions,
    private readonly reflector: Reflector,
    @Optional() @Inject(ADMIN_GUARD) private readonly appGuard?: CanActivate,
  ) {}

  async canActivate(context: ExecutionContext): Promise<boolean> {
    if (this.appGuard) {
      const verdict = this.appGuard.canActivate(context);
      const allowed = isObservable(verdict) ? await lastValueFrom(verdict) : await verdict;
      if (!allowed) throw new AdminRequestError('forbidden', 'the console guard refused access');
    } else {
      refuseNonLocal(context.switchToHttp().getRequest<HttpRequest>());
    }
    if (this.reflector.get<boolean>(MUTATION, context.getHandler())) {
      if (!this.options.mutations) {
        throw new AdminRequestError(
          'mutations-disabled',
          'this action changes state, and the console is read-only: ' +
            'set mutations: true in SequenceAdminModule.forRoot to allow it',
        );
      }
      refuseCrossSite(context.switchToHttp().getRequest<HttpRequest>());
    }
    return true;
  }
}

function header(request: HttpRequest, name: string): string | undefined {
  const value = request.headers?.[name];
  return Array.isArray(value) ? value.join(', ') : value;
}

/**
 * With no guard: the socket must be loopback, the Host must name this machine (a DNS-rebound
 * name does not), and no proxy may have forwarded the request (a proxy on this host connects
 * from loopback on behalf of remote clients).
 */
function refuseNonLocal(request: HttpRequest): void {
  const noGuard =
    'with no guard configured, the console serves local clients only; ' +
    'give SequenceAdminModule.forRoot a guard to serve others';
  if (!isLoopbackAddress(request.socket?.remoteAddress)) {
    throw new AdminRequestError('forbidden', `${noGuard} (the client is not on loopback)`);
  }
  const host = header(request, 'host');
  if (!isLoopbackHost(host)) {
    throw new AdminRequestError(
      'forbidden',
      `${noGuard} (Host ${JSON.stringify(host ?? '')} is not localhost or a loopback address)`,
    );
  }
  const forwarded = FORWARDING.filter((name) => header(request, name) !== undefined);
  if (forwarded.length > 0) {
    throw new AdminRequestError(
      'forbidden',
      `${noGuard} (the request came through a proxy: ${forwarded.join(', ')})`,
    );
  }
}

/**
 * An action must come from a script of the console's own origin: JSON, with the console's
 * header, and not marked cross-site by the browser. A cross-site form can send none of these.
 */
function refuseCrossSite(request: HttpRequest): void {
  const missing: string[] = [];
  const type = header(request, 'content-type');
  if (!/^application\/json\s*(;|$)/i.test(type ?? '')) {
    missing.push(`Content-Type: application/json (got ${JSON.stringify(type ?? '')})`);
  }
  if (header(request, ADMIN_REQUEST_HEADER) !== '1') missing.push('X-Sequence-Admin: 1');
  const site = header(request, 'sec-fetch-site');
  if (site !== undefined && site !== 'same-origin' && site !== 'none') {
    missing.push(`a same-origin request (Sec-Fetch-Site is ${JSON.stringify(site)})`);
  }
  if (missing.length > 0) {
    throw new AdminRequestError(
      'forbidden',
      `actions are accepted from the console's own page only; missing: ${missing.join('; ')}`,
    );
  }
}
