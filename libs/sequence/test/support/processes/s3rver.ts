import { type ChildProcessByStdio, spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Readable, Writable } from 'node:stream';

/** The credentials s3rver accepts (its defaults). */
export const S3RVER_CREDENTIALS = { accessKeyId: 'S3RVER', secretAccessKey: 'S3RVER' };

/**
 * s3rver 3.7.1, run in a child process. Two gaps of s3rver on Node 20 are dealt with here:
 * - it pages ListObjectsV2 with DES-encrypted continuation tokens, a cipher OpenSSL 3 keeps in
 *   its legacy provider: without `--openssl-legacy-provider` every truncated listing is a 500;
 * - it does not implement AbortMultipartUpload (it answers 405). The server below does what S3
 *   does, on s3rver's own layout: it removes the upload's folder of parts
 *   (`<bucket>/._S3rver_uploads/<uploadId>`), except in the `noAbortBucket` if one is named,
 *   and, as S3 does, drops a part still being written into a folder so removed.
 * Everything else is s3rver's. The child exits when its stdin closes, so it dies with the test.
 */
const SERVER_SCRIPT = `
const http = require('node:http');
const fs = require('node:fs');
const path = require('node:path');
const S3rver = require(process.env.S3RVER_MODULE);
const directory = process.env.S3RVER_DIRECTORY;
const s3rver = new S3rver({ silent: true, directory });
const handle = s3rver.callback();
const server = http.createServer((request, response) => {
  const url = new URL(request.url, 'http://s3rver');
  const uploadId = url.searchParams.get('uploadId');
  const bucket = url.pathname.split('/')[1];
  if (request.method !== 'DELETE' || uploadId === null || bucket === process.env.NO_ABORT_BUCKET) {
    handle(request, response);
    return;
  }
  const parts = path.join(directory, bucket, '._S3rver_uploads', uploadId);
  if (!/^[0-9a-f]{32}$/.test(uploadId) || !/^[a-z0-9.-]{3,63}$/.test(bucket) || !fs.existsSync(parts)) {
    response.writeHead(404, { 'content-type': 'application/xml' });
    response.end('<?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchUpload</Code>' +
      '<Message>The specified upload does not exist.</Message></Error>');
    return;
  }
  fs.rmSync(parts, { recursive: true, force: true });
  response.writeHead(204).end();
});
// A part still being written when its upload is aborted (its folder removed above) fails to
// open its file: S3 drops such a part, where s3rver leaves the error unhandled and would exit.
process.on('uncaughtException', (error) => {
  if (error && error.code === 'ENOENT' && String(error.path).includes('._S3rver_uploads')) return;
  process.stderr.write(String(error && error.stack) + '\\n');
  process.exit(1);
});
server.listen(0, '127.0.0.1', () => process.stdout.write(JSON.stringify(server.address()) + '\\n'));
process.stdin.on('end', () => process.exit(0)).resume();
`;

export interface S3rverProcess {
  /** `http://127.0.0.1:<port>`, for the client's `endpoint` (with `forcePathStyle`). */
  readonly endpoint: string;
  /** Where s3rver keeps buckets and objects (removed by `stop`). */
  readonly directory: string;
  stop(): Promise<void>;
}

export interface S3rverOptions {
  /**
   * A bucket where the server keeps s3rver's own answer to AbortMultipartUpload (405), to test
   * what a store does when an abort fails. @default none
   */
  readonly noAbortBucket?: string;
}

/** Starts s3rver on a spare loopback port, in a temporary directory; resolves once it listens. */
export async function startS3rver(options: S3rverOptions = {}): Promise<S3rverProcess> {
  const directory = await mkdtemp(join(tmpdir(), 'nseq-s3rver-'));
  const child: ChildProcessByStdio<Writable, Readable, Readable> = spawn(
    process.execPath,
    ['--openssl-legacy-provider', '-e', SERVER_SCRIPT],
    {
      env: {
        ...process.env,
        S3RVER_MODULE: require.resolve('s3rver'),
        S3RVER_DIRECTORY: directory,
        NO_ABORT_BUCKET: options.noAbortBucket ?? '',
      },
      stdio: ['pipe', 'pipe', 'pipe'],
    },
  );
  let stderr = '';
  child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const port = await new Promise<number>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`s3rver did not start: ${stderr}`)), 15_000);
    child.once('exit', (code) => reject(new Error(`s3rver exited (${code}): ${stderr}`)));
    child.stdout.once('data', (line: Buffer) => {
      clearTimeout(timer);
      resolve((JSON.parse(line.toString()) as { port: number }).port);
    });
  });
  return {
    endpoint: `http://127.0.0.1:${port}`,
    directory,
    async stop() {
      const exited = new Promise((resolve) => child.once('exit', resolve));
      child.stdin.end();
      await exited;
      await rm(directory, { recursive: true, force: true });
    },
  };
}
