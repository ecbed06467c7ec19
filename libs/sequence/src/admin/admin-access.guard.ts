import {
  type CanActivate,
  type ExecutionContext,
  Inject,
  Injectable,
  Optional,
  SetMetadata,
} from '@nestjs/common';
import { Reflector } from '@nestjs/core';
import { isObservable, lastValueFrom } from 'rxjs';
import { AdminRequestError } from './admin.errors';
import { ADMIN_GUARD, ADMIN_OPTIONS, type ResolvedAdminOptions } from './admin.options';
import { isLoopbackAddress } from './loopback';

const MUTATION = 'nest-sequence:admin-mutation';

/** Marks a route that changes something: refused unless `mutations: true`. */
export const AdminMutation = (): MethodDecorator => SetMetadata(MUTATION, true);

interface SocketRequest {
  readonly socket?: { readonly remoteAddress?: string };
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
      const request = context.switchToHttp().getRequest<SocketRequest>();
      if (!isLoopbackAddress(request.socket?.remoteAddress)) {
        throw new AdminRequestError(
          'forbidden',
          'with no guard configured, the console serves loopback clients only; ' +
            'give SequenceAdminModule.forRoot a guard to serve others',
        );
      }
    }
    if (this.reflector.get<boolean>(MUTATION, context.getHandler()) && !this.options.mutations) {
      throw new AdminRequestError(
        'mutations-disabled',
        'this action changes state, and the console is read-only: ' +
          'set mutations: true in SequenceAdminModule.forRoot to allow it',
      );
    }
    return true;
  }
}
