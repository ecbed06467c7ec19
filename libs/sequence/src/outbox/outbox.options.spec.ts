import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import { OUTBOX_DEFAULTS, resolveOutboxOptions } from './outbox.options';

function problems(options: unknown): string {
  try {
    resolveOutboxOptions(options as never);
  } catch (error) {
    expect(error).toBeInstanceOf(SequenceOptionsError);
    return (error as SequenceOptionsError).problems.join('\n');
  }
  throw new Error('expected a SequenceOptionsError');
}

describe('outbox options', () => {
  it('apply the defaults: relays on, inboxes decided by their handlers, 5 s / 2 s polls', () => {
    const resolved = resolveOutboxOptions(undefined);
    expect(resolved.configured).toBe(false);
    expect(resolved.boxes.outbox_events).toMatchObject({
      enabled: true,
      pollIntervalMs: 5_000,
      batchSize: 100,
      ordered: false,
    });
    expect(resolved.boxes.inbox_commands).toMatchObject({
      enabled: undefined,
      pollIntervalMs: 2_000,
    });
    expect(resolved.publishTimeoutMs).toBe(OUTBOX_DEFAULTS.publishTimeoutMs);
    expect(resolveOutboxOptions({}).configured).toBe(true);
  });

  it('route events to events.<type> and commands to commands.<targetService> by default', () => {
    const { routeEvent, routeCommand } = resolveOutboxOptions({});
    expect(routeEvent({ type: 'OrderPlaced' } as never)).toEqual(['events.OrderPlaced']);
    expect(routeCommand({ targetService: 'billing' } as never)).toBe('commands.billing');
    const fanOut = resolveOutboxOptions({ routes: { event: () => ['a', 'b'] } });
    expect(fanOut.routeEvent({} as never)).toEqual(['a', 'b']);
  });

  it('list every bad value with what to fix', () => {
    const text = problems({
      serviceName: 'has space',
      publishTimeoutMs: '100',
      outboxEvents: { batchSize: 0, retryBaseMs: 100, retryMaxMs: 10 },
      inboxEvents: { retentionMs: -1 },
      store: {},
    });
    expect(text).toMatch(/serviceName/);
    expect(text).toMatch(/publishTimeoutMs must be an integer >= 1, got the string "100"/);
    expect(text).toMatch(/outboxEvents.batchSize must be an integer >= 1/);
    expect(text).toMatch(/outboxEvents.retryMaxMs must be >= retryBaseMs/);
    expect(text).toMatch(/inboxEvents.retentionMs/);
    expect(text).toMatch(/outbox.store must be an OutboxStore/);
  });
});
