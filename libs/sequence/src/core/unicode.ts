/** A UTF-16 surrogate without its pair. */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/**
 * Whether `text` holds a lone surrogate, which UTF-8 (Redis keys, database text, AMQP strings)
 * cannot carry: each becomes U+FFFD, so that two such strings would become one.
 */
export function hasLoneSurrogate(text: string): boolean {
  return LONE_SURROGATE.test(text);
}

/**
 * What in `text` no database column keeps as given, or undefined: NUL (PostgreSQL's text and
 * JSONB refuse it) and lone surrogates (UTF-8 has none: a driver writes U+FFFD, so two ids could
 * become one).
 */
export function unstorableText(
  text: string,
): 'NUL (U+0000)' | 'a lone UTF-16 surrogate' | undefined {
  if (text.includes('\u0000')) return 'NUL (U+0000)';
  if (hasLoneSurrogate(text)) return 'a lone UTF-16 surrogate';
  return undefined;
}

const LONE_SURROGATES = new RegExp(LONE_SURROGATE.source, 'g');

/** `text` with each lone surrogate replaced by U+FFFD, as a UTF-8 encoder would write it once. */
export function replaceLoneSurrogates(text: string): string {
  return text.replace(LONE_SURROGATES, '\uFFFD');
}

// fatal: bytes that are not UTF-8 are refused, not each turned into U+FFFD (after which two
// different byte strings could decode to one text). Stateless between decode() calls.
const STRICT_UTF8 = new TextDecoder('utf-8', { fatal: true });
const STRICT_UTF8_KEEPING_BOM = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/**
 * `bytes` as text when they are valid UTF-8, else `undefined` (the caller says why it refuses
 * them). A leading byte order mark is dropped, as `TextDecoder` does, unless `keepBom` (then it
 * is the text's first character, U+FEFF).
 */
export function strictUtf8(
  bytes: Uint8Array,
  options: { readonly keepBom?: boolean } = {},
): string | undefined {
  try {
    return (options.keepBom ? STRICT_UTF8_KEEPING_BOM : STRICT_UTF8).decode(bytes);
  } catch {
    return undefined;
  }
}
