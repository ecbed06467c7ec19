import type { Logger } from '@nestjs/common';
import { crc32 } from '../core/checksum';
import { userHeadersRefusal } from '../core/completeness';
import { errorMessage } from '../core/errors/caught';
import { MalformedFragmentError } from '../core/errors/malformed-fragment.error';
import { deathReason, type RejectionCode } from '../core/errors/rejection-code';
import { parseFragmentHeaders, type FragmentHeaders } from '../core/headers';
import type { ResolvedSequenceConsumer } from '../options/resolved-options';
import type { Disposition } from '../ports/transport.port';
import type { SequenceLifecycle, FragmentIds } from './sequence.events';
import type { SequenceMetrics } from './sequence.metrics';

/**
 * The checks every fragment passes before it is buffered, wherever that is: its body within
 * `maxFragmentBytes`, its headers well-formed and its user headers within `maxHeaderBytes`, its
 * body's CRC-32 as declared. A refused fragment becomes a `dead-letter` with the reason, counted
 * and reported as a rejected fragment.
 */
export class FragmentChecks {
  constructor(
    private readonly metrics: SequenceMetrics,
    private readonly lifecycle: SequenceLifecycle,
    private readonly logger: Logger,
  ) {}

  /** The fragment's parsed headers, or the dead-letter that refuses it. */
  check(
    channel: string,
    body: Buffer,
    headers: Readonly<Record<string, unknown>>,
    options: Pick<ResolvedSequenceConsumer, 'maxFragmentBytes' | 'maxHeaderBytes'>,
  ): FragmentHeaders | Disposition {
    this.metrics.fragmentReceived(channel, body.length);
    if (body.length > options.maxFragmentBytes) {
      return this.reject(
        channel,
        'fragment-too-large',
        `${body.length}-byte body exceeds maxFragmentBytes (${options.maxFragmentBytes})`,
      );
    }
    let fragment: FragmentHeaders;
    try {
      fragment = parseFragmentHeaders(headers);
    } catch (error) {
      if (error instanceof MalformedFragmentError) {
        return this.reject(channel, error.code, error.message);
      }
      return this.reject(channel, 'malformed-header', errorMessage(error));
    }
    const { sequenceId, position } = fragment;
    const headersRefused = userHeadersRefusal(fragment.userHeaders, options.maxHeaderBytes);
    if (headersRefused) {
      return this.reject(
        channel,
        headersRefused.code,
        `sequence ${sequenceId} fragment ${position}: ${headersRefused.detail}`,
        fragment,
      );
    }
    const bodyCrc = crc32(body);
    if (bodyCrc !== fragment.crc32) {
      return this.reject(
        channel,
        'crc-mismatch',
        `sequence ${sequenceId} fragment ${position}: body CRC-32 is ${bodyCrc}, header says ${fragment.crc32}`,
        fragment,
      );
    }
    return fragment;
  }

  reject(
    channel: string,
    code: RejectionCode,
    detail: string,
    fragment?: FragmentIds,
  ): Disposition {
    this.metrics.fragmentRejected(channel, code);
    this.lifecycle.fragmentRejected(channel, code, detail, fragment);
    this.logger.warn(`${channel}: dead-lettered a fragment: ${deathReason(code, detail)}`);
    return { action: 'dead-letter', reason: deathReason(code, detail) };
  }
}

/** Whether `checked` is the dead-letter that refused a fragment, rather than its headers. */
export function isRefusal(checked: FragmentHeaders | Disposition): checked is Disposition {
  return 'action' in checked;
}
