/** `x-sequence-id`: 1–128 characters of `[A-Za-z0-9._:-]`. */
export const SEQUENCE_ID_PATTERN = /^[A-Za-z0-9._:-]{1,128}$/;
