import { createHash } from 'node:crypto';

/**
 * How channels map to JetStream names.
 *
 * - **Subject**: the channel itself, so that other programs publish to a channel with a plain
 *   `nc.publish('<channel>', …)` or `js.publish`. It must be a literal NATS subject: no
 *   whitespace, no empty token (a leading, trailing or doubled `.`), no `*` or `>` token.
 * - **Stream**: `<streamPrefix>` followed by the channel with every character outside
 *   `[A-Za-z0-9-]` written as `_XX` (its UTF-8 bytes in upper-case hex): `orders.v1` becomes
 *   `NSEQ_orders_2Ev1`. Stream names may not hold `.`, `*`, `>`, whitespace or path separators;
 *   the escape maps distinct channels to distinct names. A name that would pass
 *   {@link MAX_STREAM_NAME_CHARS} keeps its first characters and ends with `_` and 16 hex
 *   digits of the channel's SHA-256.
 * - **Consumer**: one durable pull consumer per stream, named by the `durableName` option.
 * - **Reply channels**: subjects `nseq-reply.<uuid>`, all in one stream `<streamPrefix>_REPLY`
 *   (no channel's stream name can be that: an escape `_` is followed by two hex digits), each
 *   read by a consumer of its own, `reply-<uuid>`. Channels under `nseq-reply.` are reserved.
 */

/** The subjects of reply channels: `nseq-reply.<uuid>`. */
export const REPLY_SUBJECT_PREFIX = 'nseq-reply.';

/** The stream of every reply channel. */
export function replyStreamName(prefix: string): string {
  return `${prefix}_REPLY`;
}

/** True for a reply channel's subject. */
export function isReplyChannel(channel: string): boolean {
  return channel.startsWith(REPLY_SUBJECT_PREFIX);
}

/** Longest stream name produced: JetStream stores a stream in a directory of that name. */
export const MAX_STREAM_NAME_CHARS = 200;

const SAFE_STREAM_CHAR = /[A-Za-z0-9-]/;

/** The stream that holds `channel`'s messages. */
export function streamName(prefix: string, channel: string): string {
  let escaped = '';
  for (const char of channel) {
    if (SAFE_STREAM_CHAR.test(char)) {
      escaped += char;
      continue;
    }
    for (const byte of Buffer.from(char, 'utf8')) {
      escaped += `_${byte.toString(16).toUpperCase().padStart(2, '0')}`;
    }
  }
  const name = `${prefix}${escaped}`;
  if (name.length <= MAX_STREAM_NAME_CHARS) return name;
  const digest = createHash('sha256').update(channel).digest('hex').slice(0, 16);
  return `${name.slice(0, MAX_STREAM_NAME_CHARS - 17)}_${digest}`;
}

/** Why `channel` cannot be a NATS subject, or undefined when it can. */
export function subjectProblem(channel: string): string | undefined {
  if (channel.length === 0) return 'is empty';
  if (hasControlOrSpace(channel)) return 'holds whitespace or a control character';
  const tokens = channel.split('.');
  if (tokens.some((token) => token.length === 0)) {
    return 'has an empty token (a leading, trailing or doubled ".")';
  }
  if (tokens.some((token) => token === '*' || token === '>')) {
    return 'has a wildcard token ("*" or ">")';
  }
  return undefined;
}

/** True for a stream name (or durable name) JetStream accepts. */
export function isValidJetStreamName(name: string): boolean {
  return name.length > 0 && !/[.*>/\\]/.test(name) && !hasControlOrSpace(name);
}

function hasControlOrSpace(text: string): boolean {
  for (let i = 0; i < text.length; i++) {
    const code = text.charCodeAt(i);
    if (code <= 32 || code === 127 || /\s/.test(text[i])) return true;
  }
  return false;
}
