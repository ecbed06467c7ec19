import { Controller } from '@nestjs/common';
import { Ctx, EventPattern, Payload } from '@nestjs/microservices';
import { lastValueFrom } from 'rxjs';
import { HandlerTimeoutError, InMemoryTransport } from 'nest-sequence';
import type { SequenceContext } from 'nest-sequence/microservices';
import { createMicroserviceTestApp, type MicroserviceTestApp } from './microservice-test-app';

const TIMEOUT_MS = 30;
const signals: AbortSignal[] = [];

@Controller()
class StuckController {
  @EventPattern('ms.stuck')
  stuck(@Payload() _data: unknown, @Ctx() ctx: SequenceContext): Promise<void> {
    signals.push(ctx.getSignal());
    return new Promise<void>(() => undefined); // never settles
  }

  @EventPattern('ms.free')
  free(@Payload() _data: unknown, @Ctx() ctx: SequenceContext): void {
    signals.push(ctx.getSignal());
  }
}

describe('microservices: an @EventPattern handler that runs past handlerTimeoutMs', () => {
  const transport = new InMemoryTransport();
  let t: MicroserviceTestApp;

  beforeAll(async () => {
    t = await createMicroserviceTestApp({
      sequence: { transport, handlerRetry: { attempts: 2, baseDelayMs: 1, maxDelayMs: 1 } },
      controllers: [StuckController],
      server: { channels: { 'ms.stuck': { handlerTimeoutMs: TIMEOUT_MS } } },
    });
  });
  afterAll(() => t?.close());
  beforeEach(() => (signals.length = 0));

  const emit = (pattern: string, data: unknown) =>
    lastValueFrom(t.client.emit(pattern, data), { defaultValue: undefined });

  it("aborts @Ctx()'s signal, retries, then dead-letters the message handler-timeout", async () => {
    await emit('ms.stuck', { study: 'CT-9' });
    await transport.whenIdle();

    expect(signals).toHaveLength(2);
    expect(signals.every((signal) => signal.reason instanceof HandlerTimeoutError)).toBe(true);
    const dead = transport.take(transport.deadLetterChannel('ms.stuck'));
    expect(dead.map((message) => String(message.headers['x-death-reason']))).toEqual([
      expect.stringMatching(
        new RegExp(`^handler-timeout: an inline payload: handler timed out after ${TIMEOUT_MS} ms`),
      ),
    ]);
  });

  it('hands a signal that is never aborted to a channel without a limit', async () => {
    await emit('ms.free', { study: 'CT-10' });
    await transport.whenIdle();

    expect(signals).toHaveLength(1);
    expect(signals[0].aborted).toBe(false);
  });
});
