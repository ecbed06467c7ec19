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

/** What a guard sees of one HTTP request: the socket's address and its headers. */
function request(
  route: 'read' | 'act',
  remoteAddress: string,
  headers: Record<string, string> = {},
): ExecutionContext {
  const http = { socket: { remoteAddress }, headers: { host: '127.0.0.1:3000', ...headers } };
  return {
    getHandler: () => Routes.prototype[route],
    getClass: () => Routes,
    switchToHttp: () => ({ getRequest: () => http }),
  } as unknown as ExecutionContext;
}

/**
 * 'allowed' only when the guard returns true; the code of the error it throws; or what else it
 * returned (`false` is a refusal too: Nest answers it with 403, without the guard's reason).
 */
async function refusal(guard: AdminAccessGuard, context: ExecutionContext): Promise<string> {
  try {
    const verdict: unknown = await guard.canActivate(context);
    return verdict === true ? 'allowed' : `returned ${String(verdict)}`;
  } catch (error) {
    return error instanceof AdminRequestError ? error.code : String(error);
  }
}

/** The headers the console page's actions carry. */
const fromPage = { 'content-type': 'application/json', 'x-sequence-admin': '1' };

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

    it('refuses a Host that is not loopback: a DNS-rebound name', async () => {
      for (const host of [
        'localhost:3000',
        'LOCALHOST',
        '127.0.0.1',
        '127.1.2.3:80',
        '[::1]:3000',
      ]) {
        expect(await refusal(guard, request('read', '127.0.0.1', { host }))).toBe('allowed');
      }
      for (const host of ['evil.example:3000', 'localhost.evil.example', '10.0.0.5', '[::2]', '']) {
        expect(await refusal(guard, request('read', '127.0.0.1', { host }))).toBe('forbidden');
      }
    });

    it('refuses a request a proxy forwarded, though the proxy connects from loopback', async () => {
      for (const name of ['forwarded', 'x-forwarded-for', 'x-real-ip']) {
        const forwarded = request('read', '127.0.0.6', { [name]: '203.0.113.9' });
        expect(await refusal(guard, forwarded)).toBe('forbidden');
      }
    });

    it('refuses mutations with mutations-disabled unless they are enabled', async () => {
      expect(await refusal(guard, request('act', '127.0.0.1', fromPage))).toBe(
        'mutations-disabled',
      );
      const enabled = new AdminAccessGuard(resolveAdminOptions({ mutations: true }), reflector);
      expect(await refusal(enabled, request('act', '127.0.0.1', fromPage))).toBe('allowed');
    });
  });

  describe("with the app's guard", () => {
    const app = (allow: boolean): CanActivate => ({ canActivate: async () => allow });

    it('lets it decide, for remote clients too', async () => {
      const options = resolveAdminOptions({ mutations: true });
      const allowing = new AdminAccessGuard(options, reflector, app(true));
      const refusing = new AdminAccessGuard(options, reflector, app(false));
      expect(await refusal(allowing, request('act', '10.0.0.5', fromPage))).toBe('allowed');
      expect(await refusal(refusing, request('read', '127.0.0.1'))).toBe('forbidden');
    });

    it('still refuses mutations while they are off', async () => {
      const guard = new AdminAccessGuard(resolveAdminOptions({}), reflector, app(true));
      expect(await refusal(guard, request('act', '10.0.0.5'))).toBe('mutations-disabled');
    });
  });

  describe('actions from another site (CSRF)', () => {
    const options = resolveAdminOptions({ mutations: true });
    const guards = {
      'no guard': new AdminAccessGuard(options, reflector),
      "the app's guard": new AdminAccessGuard(options, reflector, { canActivate: () => true }),
    };

    it.each(Object.entries(guards))('refuses a form post, with %s', async (_, guard) => {
      const form = { 'content-type': 'application/x-www-form-urlencoded' };
      expect(await refusal(guard, request('act', '127.0.0.1', form))).toBe('forbidden');
      const plain = { 'content-type': 'text/plain', 'x-sequence-admin': '1' };
      expect(await refusal(guard, request('act', '127.0.0.1', plain))).toBe('forbidden');
    });

    it.each(Object.entries(guards))(
      'refuses JSON without the header, with %s',
      async (_, guard) => {
        const json = { 'content-type': 'application/json' };
        expect(await refusal(guard, request('act', '127.0.0.1', json))).toBe('forbidden');
        expect(await refusal(guard, request('act', '127.0.0.1'))).toBe('forbidden');
      },
    );

    it.each(Object.entries(guards))(
      'refuses what the browser marks cross-site, with %s',
      async (_, guard) => {
        for (const site of ['cross-site', 'same-site']) {
          const headers = { ...fromPage, 'sec-fetch-site': site };
          expect(await refusal(guard, request('act', '127.0.0.1', headers))).toBe('forbidden');
        }
        for (const site of ['same-origin', 'none']) {
          const headers = { ...fromPage, 'sec-fetch-site': site };
          expect(await refusal(guard, request('act', '127.0.0.1', headers))).toBe('allowed');
        }
      },
    );

    it('says what was missing, and leaves reads alone', async () => {
      const guard = guards['no guard'];
      await expect(guard.canActivate(request('act', '127.0.0.1'))).rejects.toThrow(
        /Content-Type: application\/json.*X-Sequence-Admin: 1/,
      );
      expect(await refusal(guard, request('read', '127.0.0.1'))).toBe('allowed');
    });
  });
});
