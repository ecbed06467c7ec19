import type { CanActivate, ExecutionContext } from '@nestjs/common';
import { Reflector } from '@nestjs/core';
import { AdminAccessGuard, AdminMutation } from './admin-access.guard';
import { AdminRequestError } from './admin.errors';
import { resolveAdminOptions } from './admin.options';

class Routes {
  read(): void {}
  @AdminMutation()
  act(): void {}
}

/** What a guard sees of one HTTP request: the socket's address and any forwarded header. */
function request(
  route: 'read' | 'act',
  remoteAddress: string,
  headers: Record<string, string> = {},
): ExecutionContext {
  const http = { socket: { remoteAddress }, headers };
  return {
    getHandler: () => Routes.prototype[route],
    getClass: () => Routes,
    switchToHttp: () => ({ getRequest: () => http }),
  } as unknown as ExecutionContext;
}

async function refusal(guard: AdminAccessGuard, context: ExecutionContext): Promise<string> {
  try {
    await guard.canActivate(context);
    return 'allowed';
  } catch (error) {
    return error instanceof AdminRequestError ? error.code : String(error);
  }
}

describe('AdminAccessGuard', () => {
  const reflector = new Reflector();

  describe('with no guard of the app', () => {
    const guard = new AdminAccessGuard(resolveAdminOptions({}), reflector);

    it('serves loopback clients', async () => {
      expect(await refusal(guard, request('read', '127.0.0.1'))).toBe('allowed');
      expect(await refusal(guard, request('read', '::1'))).toBe('allowed');
    });

    it('refuses other clients with forbidden, whatever X-Forwarded-For says', async () => {
      expect(await refusal(guard, request('read', '10.0.0.5'))).toBe('forbidden');
      expect(
        await refusal(guard, request('read', '10.0.0.5', { 'x-forwarded-for': '127.0.0.1' })),
      ).toBe('forbidden');
    });

    it('refuses mutations with mutations-disabled unless they are enabled', async () => {
      expect(await refusal(guard, request('act', '127.0.0.1'))).toBe('mutations-disabled');
      const enabled = new AdminAccessGuard(resolveAdminOptions({ mutations: true }), reflector);
      expect(await refusal(enabled, request('act', '127.0.0.1'))).toBe('allowed');
    });
  });

  describe("with the app's guard", () => {
    const app = (allow: boolean): CanActivate => ({ canActivate: async () => allow });

    it('lets it decide, for remote clients too', async () => {
      const options = resolveAdminOptions({ mutations: true });
      const allowing = new AdminAccessGuard(options, reflector, app(true));
      const refusing = new AdminAccessGuard(options, reflector, app(false));
      expect(await refusal(allowing, request('act', '10.0.0.5'))).toBe('allowed');
      expect(await refusal(refusing, request('read', '127.0.0.1'))).toBe('forbidden');
    });

    it('still refuses mutations while they are off', async () => {
      const guard = new AdminAccessGuard(resolveAdminOptions({}), reflector, app(true));
      expect(await refusal(guard, request('act', '10.0.0.5'))).toBe('mutations-disabled');
    });
  });
});
