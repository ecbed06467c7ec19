import { ResequenceHeader, type ResequencerInput } from '../core/resequence-input';
import {
  isResequencerKey,
  isSequenceNumber,
  MAX_SEQUENCE_NUMBER,
} from '../ports/resequencer-store.port';
import type { ResequencerField } from '../options/resequencer.options';

import { errorMessage } from '../core/errors/caught';
import { strictUtf8 } from '../core/unicode';

/** An event's key and sequence number, or why they could not be read. */
export type EventPosition =
  | { readonly ok: true; readonly key: string; readonly seq: number }
  | { readonly ok: false; readonly problem: string };

const DECIMAL = /^(0|[1-9][0-9]{0,15})$/;

/** Reads key and seq as a resequencer's definition says (header names or functions). */
export function positionOf(
  message: ResequencerInput,
  key: ResequencerField<string> = ResequenceHeader.key,
  seq: ResequencerField<number> = ResequenceHeader.seq,
): EventPosition {
  let keyValue: unknown;
  let seqValue: unknown;
  try {
    keyValue = typeof key === 'function' ? key(message) : message.headers[key];
  } catch (error) {
    return { ok: false, problem: `the key function threw: ${errorMessage(error)}` };
  }
  try {
    seqValue = typeof seq === 'function' ? seq(message) : message.headers[seq];
  } catch (error) {
    return { ok: false, problem: `the seq function threw: ${errorMessage(error)}` };
  }
  // AMQP headers written by other clients may carry numbers as numbers or strings, and text as
  // a byte array (a Buffer here).
  if (typeof keyValue === 'number' && Number.isSafeInteger(keyValue)) keyValue = String(keyValue);
  if (Buffer.isBuffer(keyValue)) keyValue = utf8(keyValue);
  if (Buffer.isBuffer(seqValue)) seqValue = utf8(seqValue);
  if (typeof seqValue === 'string' && DECIMAL.test(seqValue)) seqValue = Number(seqValue);
  if (typeof seqValue === 'bigint') seqValue = Number(seqValue);
  const where = (field: ResequencerField<unknown>, name: string) =>
    typeof field === 'function' ? `the ${name} function's result` : `header ${field}`;
  if (!isResequencerKey(keyValue)) {
    return {
      ok: false,
      problem: `${where(key, 'key')} must be 1-256 characters without control characters or lone surrogates (bytes: valid UTF-8), got ${show(keyValue)}`,
    };
  }
  if (!isSequenceNumber(seqValue)) {
    return {
      ok: false,
      problem: `${where(seq, 'seq')} must be an integer >= 0 (at most ${MAX_SEQUENCE_NUMBER}), got ${show(seqValue)}`,
    };
  }
  return { ok: true, key: keyValue, seq: seqValue };
}

/**
 * Bytes as text when they are valid UTF-8; else the bytes themselves (refused as a key): a lenient
 * decoding would turn every invalid sequence into U+FFFD, and two keys into one. A leading U+FEFF
 * is part of the key (else BOM + 'T1' and 'T1' would be one key).
 */
function utf8(bytes: Buffer): string | Buffer {
  return strictUtf8(bytes, { keepBom: true }) ?? bytes;
}

function show(value: unknown): string {
  if (value === undefined) return 'nothing';
  let text: string;
  if (typeof value === 'number' || typeof value === 'boolean' || typeof value === 'bigint') {
    text = String(value);
  } else {
    try {
      text = JSON.stringify(value) ?? typeof value; // functions and symbols have no JSON
    } catch {
      text = `a ${typeof value} that JSON cannot show (a cycle, or a bigint inside)`;
    }
  }
  return text.length > 80 ? `${text.slice(0, 80)}…` : text;
}
