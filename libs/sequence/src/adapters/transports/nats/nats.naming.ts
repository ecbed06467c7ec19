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
 * - **Partitioned channels**: partition `i` of channel `<channel>` is the subject
 *   `<channel>.partition.<i>`, in a stream of the channel's own, `<stream>_PARTITIONS` (the
 *   channel's stream name with that suffix), read by one durable consumer per partition,
 *   `<durableName>-p<i>`. Its leases are the subjects `nseq-lease.<channel>.<i>` of a stream
 *   `<stream>_LEASES`. No channel's stream name ends that way: an escape `_` is followed by two
 *   hex digits, and `P` and `L` are not. A released lease is announced on the core subject
 *   `nseq-lease-free.<channel>`. Channels under `nseq-lease` are reserved.
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

/** The subjects of partition leases: `nseq-lease.<channel>.<partition>`. */
export const LEASE_SUBJECT_PREFIX = 'nseq-lease.';

/** Core subjects on which a released lease is announced: `nseq-lease-free.<channel>`. */
export const LEASE_FREE_SUBJECT_PREFIX = 'nseq-lease-free.';

/** Partition `index`'s subject of a partitioned channel: `<channel>.partition.<index>`. */
export function partitionSubject(channel: string, index: number): string {
  return `${channel}.partition.${index}`;
}

/** The subject of partition `index`'s lease: `nseq-lease.<channel>.<index>`. */
export function leaseSubject(channel: string, index: number): string {
  return `${LEASE_SUBJECT_PREFIX}${channel}.${index}`;
}

/** The durable consumer of partition `index`: `<durableName>-p<index>`. */
export function partitionConsumerName(durableName: string, index: number): string {
  return `${durableName}-p${index}`;
}

/** The stream of a partitioned channel's partitions: `<stream>_PARTITIONS`. */
export function partitionStreamName(prefix: string, channel: string): string {
  return streamName(prefix, channel, '_PARTITIONS');
}

/** The stream of a partitioned channel's leases: `<stream>_LEASES`. */
export function leaseStreamName(prefix: string, channel: string): string {
  return streamName(prefix, channel, '_LEASES');
}

/**
 * The stream that holds `channel`'s messages, followed by `suffix` (which must not start with `_`
 * and two hex digits); within {@link MAX_STREAM_NAME_CHARS}, suffix included.
 */
export function streamName(prefix: string, channel: string, suffix = ''): string {
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
  const room = MAX_STREAM_NAME_CHARS - suffix.length;
  if (name.length <= room) return `${name}${suffix}`;
  const digest = createHash('sha256').update(channel).digest('hex').slice(0, 16);
  return `${name.slice(0, room - 17)}_${digest}${suffix}`;
}

/**
 * Longest channel name, in UTF-8 bytes. nats-server cuts the whole connection on a protocol line
 * over its `max_control_line` (4,096 bytes by default), and a publish's line holds the subject,
 * a reply inbox and two lengths: this leaves room for the subjects the transport derives from a
 * channel (`<channel>.dlq`, `<channel>.partition.<i>`, `nseq-lease.<channel>.<i>`).
 */
export const MAX_CHANNEL_BYTES = 1024;

/** Why `channel` cannot be a NATS subject, or undefined when it can. */
export function subjectProblem(channel: string): string | undefined {
  if (channel.length === 0) return 'is empty';
  const bytes = Buffer.byteLength(channel);
  if (bytes > MAX_CHANNEL_BYTES) {
    return `is ${bytes} bytes long, more than ${MAX_CHANNEL_BYTES} (UTF-8)`;
  }
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
