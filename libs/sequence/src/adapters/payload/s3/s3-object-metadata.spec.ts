import { PayloadMetadataCorruptError } from '../../../core/errors/payload-metadata-corrupt.error';
import { decodeObjectMetadata, encodeObjectMetadata } from './s3-object-metadata';

describe('S3 object metadata', () => {
  const fallback = { createdAt: 1, expiresAt: 2 };
  const written = encodeObjectMetadata({
    now: 1_000,
    expiresAt: 2_000,
    published: true,
    contentType: 'application/dicom; charset=ü',
    metadata: { Study: 'CT 4', patient: 'Ünal' },
  });

  it('reads back what it wrote', () => {
    expect(decodeObjectMetadata(written, fallback, 'r')).toEqual({
      createdAt: 1_000,
      expiresAt: 2_000,
      contentType: 'application/dicom; charset=ü',
      metadata: { Study: 'CT 4', patient: 'Ünal' },
    });
  });

  it.each([
    ['user metadata that is not base64url JSON', { 'nseq-metadata': 'e3N0dWR5' }],
    ['user metadata that is not an object of strings', { 'nseq-metadata': 'WzFd' }],
    ['a content type that is not URI-encoded', { 'nseq-content-type': '%E0%A4%A' }],
  ])('answers %s with PayloadMetadataCorruptError naming the ref', (_, changed) => {
    expect(() => decodeObjectMetadata({ ...written, ...changed }, fallback, 'a/b')).toThrow(
      PayloadMetadataCorruptError,
    );
    expect(() => decodeObjectMetadata({ ...written, ...changed }, fallback, 'a/b')).toThrow(
      /s3 payload store cannot read the metadata of a\/b/,
    );
  });
});
