import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import {
  MESSAGE_TYPE_PATTERN,
  SERVICE_NAME_PATTERN,
  type OutboxCommand,
  type OutboxEvent,
} from '../core/outbox-message';
import { definedOnly } from '../core/objects';
import { checkDelay, checkInteger, checkOneOf, checkPrefetch } from '../core/option-checks';
import type { BoxName, MessageKind } from '../ports/outbox-store.port';
import { DEFAULTS } from './defaults';
import { checkKeys, INBOX_HANDLER_KEYS } from './option-keys';
import type { BoxOptions, OutboxOptions } from './outbox.options';
import type { ResolvedBoxOptions, ResolvedOutboxOptions } from './resolved-options';
import { notAStringSuffix, resolveHandlerTimeout, resolveRetryPolicy } from './resolve-shared';

/** The option naming each box. */
const BOX_OPTIONS: Record<
  BoxName,
  'outboxEvents' | 'outboxCommands' | 'inboxEvents' | 'inboxCommands'
> = {
  outbox_events: 'outboxEvents',
  outbox_commands: 'outboxCommands',
  inbox_events: 'inboxEvents',
  inbox_commands: 'inboxCommands',
};

export const defaultEventChannel = (event: Pick<OutboxEvent, 'type'>): string =>
  `events.${event.type}`;
export const defaultCommandChannel = (command: Pick<OutboxCommand, 'targetService'>): string =>
  `commands.${command.targetService}`;

function resolveBox(problems: string[], box: BoxName, options?: BoxOptions): ResolvedBoxOptions {
  const inbox = box.startsWith('inbox');
  const at = `outbox.${BOX_OPTIONS[box]}`;
  // Not an object (null from an empty YAML key): refused by the key check; its defaults here.
  const given: BoxOptions = typeof options === 'object' && options !== null ? options : {};
  const { retry, ...rest } = given;
  const kind = inbox ? DEFAULTS.outbox.inboxes : DEFAULTS.outbox.outboxes;
  const resolved: ResolvedBoxOptions = {
    enabled: inbox ? undefined : true,
    pollIntervalMs: kind.pollIntervalMs,
    batchSize: kind.batchSize,
    concurrency: kind.concurrency,
    ordered: DEFAULTS.outbox.ordered,
    retentionMs: DEFAULTS.outbox.retentionMs,
    prefetch: DEFAULTS.outbox.inboxes.prefetch,
    ...definedOnly(rest),
    retry: resolveRetryPolicy(problems, `${at}.retry`, retry, DEFAULTS.outbox.retry),
  };
  if (resolved.enabled !== undefined) {
    checkOneOf(problems, `${at}.enabled`, resolved.enabled, [true, false]);
  }
  checkDelay(problems, `${at}.pollIntervalMs`, resolved.pollIntervalMs, 10);
  checkInteger(problems, `${at}.batchSize`, resolved.batchSize, 1);
  checkInteger(problems, `${at}.concurrency`, resolved.concurrency, 1);
  checkOneOf(problems, `${at}.ordered`, resolved.ordered, [true, false]);
  if (resolved.retentionMs === 0 && inbox) {
    problems.push(
      `${at}.retentionMs must be at least 1: an inbox's completed records are the ids that ` +
        'recognise duplicates, so keep them longer than a duplicate can take to arrive',
    );
  } else if (resolved.retentionMs !== false) {
    // 0: an outbox's relay deletes what it published instead of marking it COMPLETED.
    checkInteger(problems, `${at}.retentionMs`, resolved.retentionMs, 0);
  }
  if (given.prefetch !== undefined && !inbox) {
    problems.push(`${at}.prefetch is for inboxes (an outbox's relay consumes nothing)`);
  }
  checkPrefetch(problems, `${at}.prefetch`, resolved.prefetch);
  // An ordered inbox takes one message at a time, so that its records are appended in the
  // order this instance received them.
  return resolved.ordered && inbox ? { ...resolved, prefetch: 1 } : resolved;
}

/** The module's `outbox` options over the defaults; problems are added to `problems`. */
export function resolveOutboxOptions(
  problems: string[],
  given: OutboxOptions | undefined,
): ResolvedOutboxOptions {
  const options = given ?? {};
  const boxes = Object.fromEntries(
    (Object.keys(BOX_OPTIONS) as BoxName[]).map((box) => [
      box,
      resolveBox(problems, box, options[BOX_OPTIONS[box]]),
    ]),
  ) as Record<BoxName, ResolvedBoxOptions>;
  const migrate = options.migrate ?? DEFAULTS.outbox.migrate;
  checkOneOf(problems, 'outbox.migrate', migrate, [true, false]);
  const { serviceName } = options;
  if (
    serviceName !== undefined &&
    (typeof serviceName !== 'string' || !SERVICE_NAME_PATTERN.test(serviceName))
  ) {
    problems.push(
      'outbox.serviceName must be 1-100 letters, digits, _ . - (it names a channel)' +
        notAStringSuffix(serviceName),
    );
  }
  // outbox.store is checked with the other adapters, in composeAdapters.
  for (const route of ['event', 'command'] as const) {
    const fn = options.routes?.[route];
    if (fn !== undefined && typeof fn !== 'function') {
      problems.push(`outbox.routes.${route} must be a function of the ${route}`);
    }
  }
  const routeEvent = options.routes?.event ?? defaultEventChannel;
  const routeCommand = options.routes?.command ?? defaultCommandChannel;
  return {
    configured: given !== undefined,
    migrate,
    serviceName: options.serviceName,
    routeEvent: (event) => routedChannels(routeEvent(event), `route of event ${event.type}`, true),
    routeCommand: (command) =>
      routedChannels(routeCommand(command), `route of command ${command.type}`, false)[0],
    boxes,
  };
}

/**
 * The channels a route gave (one, or several where `several`), or an error that says what it
 * gave instead: a route is the user's code, typed or not. A Promise (an async route) is refused,
 * its rejection handled here.
 */
function routedChannels(routed: unknown, what: string, several: boolean): readonly string[] {
  if (typeof (routed as PromiseLike<unknown> | undefined)?.then === 'function') {
    Promise.resolve(routed).catch(() => undefined);
    throw new Error(
      `${what} returned a Promise: a route gives its channel names at once (outbox.routes)`,
    );
  }
  const channels = several && Array.isArray(routed) ? (routed as unknown[]) : [routed];
  if (channels.length === 0 || channels.some((c) => typeof c !== 'string' || c.length === 0)) {
    const expected = several ? 'one or more channel names' : 'a channel name';
    throw new Error(`${what} gave ${describeRouted(routed)}, not ${expected}`);
  }
  return channels as string[];
}

function describeRouted(routed: unknown): string {
  try {
    const text = JSON.stringify(routed);
    if (text !== undefined) return text.length > 200 ? `${text.slice(0, 200)}...` : text;
  } catch {
    // a cycle or a BigInt: its type says enough
  }
  return String(typeof routed);
}

/** What an `@InboxHandler` resolves to: its message kind, type, channel and time limit. */
export interface ResolvedInboxHandler {
  readonly kind: MessageKind;
  readonly type: string;
  readonly channel: string;
  /** `undefined`: no limit. */
  readonly handlerTimeoutMs: number | undefined;
}

/**
 * An `@InboxHandler`'s options: exactly one of `event` and `command`, and its channel (by default
 * `events.<type>`, or `commands.<outbox.serviceName>`); throws {@link SequenceOptionsError}
 * naming `where`.
 */
export function resolveInboxHandler(
  where: string,
  options: {
    event?: unknown;
    command?: unknown;
    channel?: unknown;
    processInTransaction?: unknown;
    handlerTimeoutMs?: unknown;
  },
  outbox: Pick<ResolvedOutboxOptions, 'serviceName'>,
  handlerTimeoutMs: number | undefined,
): ResolvedInboxHandler {
  const unknown: string[] = [];
  checkKeys(unknown, options, INBOX_HANDLER_KEYS);
  if (unknown.length > 0) throw new SequenceOptionsError(where, unknown);
  const hasEvent = options.event !== undefined;
  const hasCommand = options.command !== undefined;
  if (hasEvent === hasCommand) {
    throw new SequenceOptionsError(where, [
      "name exactly one of `event: '<EventType>'` or `command: '<CommandType>'`",
    ]);
  }
  const kind = hasEvent ? 'event' : 'command';
  const type: unknown = hasEvent ? options.event : options.command;
  const problems: string[] = [];
  if (typeof type !== 'string' || !MESSAGE_TYPE_PATTERN.test(type)) {
    problems.push(`${kind} must be a type name (letters, digits, _ . : -), got ${String(type)}`);
  }
  if (options.channel !== undefined && (typeof options.channel !== 'string' || !options.channel)) {
    problems.push('channel must be a non-empty string');
  }
  if (kind === 'command' && options.channel === undefined && !outbox.serviceName) {
    problems.push(
      "a command handler consumes commands.<serviceName>: set `outbox: { serviceName: '...' }` " +
        'in SequenceModule.forRoot (or give the handler a channel)',
    );
  }
  // A string from a config file ('true') would otherwise run the handler outside the transaction.
  if (options.processInTransaction !== undefined) {
    checkOneOf(problems, 'processInTransaction', options.processInTransaction, [true, false]);
  }
  const timeoutMs = resolveHandlerTimeout(
    problems,
    'handlerTimeoutMs',
    options.handlerTimeoutMs as number | false | undefined,
    handlerTimeoutMs,
  );
  if (problems.length > 0) throw new SequenceOptionsError(where, problems);
  const channel =
    (options.channel as string | undefined) ??
    (kind === 'event'
      ? defaultEventChannel({ type: type as string })
      : defaultCommandChannel({ targetService: outbox.serviceName! }));
  return { kind, type: type as string, channel, handlerTimeoutMs: timeoutMs };
}
