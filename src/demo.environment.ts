import { createHash } from 'node:crypto';
import { type ClaimTicketKey } from 'nest-sequence/wire';
import { DemoEnvironmentError } from './demo-environment.error';
import { metricsEndpointProblems } from './metrics-endpoint';

const MiB = 1024 * 1024;

/** Ticket secrets shorter than an HMAC-SHA256 output are refused (as the library does). */
const MIN_KEY_BYTES = 32;

/** The broker the environment names: `AMQP_URL` for RabbitMQ, `NATS_URL` for NATS JetStream. */
export type DemoBroker =
  | { readonly kind: 'rabbitmq'; readonly url: string }
  | { readonly kind: 'nats'; readonly url: string };

/** What the demo reads from the environment besides its stores (see infrastructure.ts). */
export interface DemoEnvironment {
  /**
   * `AMQP_URL` or `NATS_URL` (not both): the broker the demo's transport talks to. Unset: the
   * in-memory transport, both roles in one process.
   */
  readonly broker?: DemoBroker;
  /**
   * `CLAIM_CHECK_ABOVE_BYTES`: studies above this size are parked in the payload store and travel
   * as a signed ticket; up to it, as a Message Sequence (or inline, up to 256 KiB).
   * @default 268435456 (256 MiB: the default 180 MB study still travels as a sequence)
   */
  readonly claimCheckAboveBytes: number;
  /**
   * `CLAIM_CHECK_KEY`: the secret tickets are signed with, shared by the producer and every
   * consumer. Unset: one random key per process, which only works when one process both sends
   * and receives (`npm start`).
   */
  readonly signingKeys?: ClaimTicketKey[];
  /** `STUDY_BYTES`: the size of the study `npm start` sends. @default 188743680 (180 MiB) */
  readonly studyBytes: number;
  /**
   * `CONSOLE_PORT`: `npm start` serves the operator console on this port of 127.0.0.1, and goes
   * on serving it after the run, until Ctrl-C (0 picks a free port). Unset: no console, and the
   * demo exits after the run.
   */
  readonly consolePort?: number;
}

export const DEFAULT_STUDY_BYTES = 180 * MiB;
/** The smallest study: one record header (see dicom-like.records.ts). */
export const MIN_STUDY_BYTES = 8;

export const DEFAULT_CLAIM_CHECK_ABOVE_BYTES = 256 * MiB;
/** The largest study the AI service reassembles from a sequence (the module's `maxSequenceBytes`). */
export const MAX_SEQUENCE_BYTES = 512 * MiB;

/**
 * Reads and checks the demo's settings; every problem is reported at once.
 * @throws DemoEnvironmentError naming each variable that is wrong and how to fix it
 */
export function readDemoEnvironment(env: NodeJS.ProcessEnv = process.env): DemoEnvironment {
  const variables: string[] = [];
  const problems: string[] = [];
  const problem = (variable: string, text: string) => {
    variables.push(variable);
    problems.push(`${variable} ${text}`);
  };

  let broker: DemoBroker | undefined;
  if (env.AMQP_URL && env.NATS_URL) {
    variables.push('AMQP_URL', 'NATS_URL');
    problems.push(
      'AMQP_URL and NATS_URL are both set; the demo runs on one broker: unset NATS_URL to use ' +
        'RabbitMQ, or AMQP_URL to use NATS JetStream',
    );
  } else if (env.AMQP_URL) {
    broker = { kind: 'rabbitmq', url: env.AMQP_URL };
  } else if (env.NATS_URL) {
    broker = { kind: 'nats', url: env.NATS_URL };
  }
  for (const [variable, text] of serverUrlProblems(env)) problem(variable, text);

  let claimCheckAboveBytes = DEFAULT_CLAIM_CHECK_ABOVE_BYTES;
  const above = env.CLAIM_CHECK_ABOVE_BYTES;
  if (above !== undefined && above !== '') {
    // The AI service refuses sequences above the module's maxSequenceBytes: a threshold above it
    // would send studies as sequences that can never be reassembled.
    const ceiling = MAX_SEQUENCE_BYTES;
    claimCheckAboveBytes = Number(above);
    if (!/^\d+$/.test(above) || !Number.isSafeInteger(claimCheckAboveBytes)) {
      problem(
        'CLAIM_CHECK_ABOVE_BYTES',
        `must be a whole number of bytes, got ${JSON.stringify(above)}`,
      );
    } else if (claimCheckAboveBytes > ceiling) {
      problem(
        'CLAIM_CHECK_ABOVE_BYTES',
        `must be at most ${ceiling} (the largest study the AI service reassembles from a ` +
          `sequence), got ${above}`,
      );
    }
  }

  let signingKeys: ClaimTicketKey[] | undefined;
  const secret = env.CLAIM_CHECK_KEY;
  if (secret !== undefined && secret !== '') {
    const bytes = Buffer.byteLength(secret, 'utf8');
    if (bytes < MIN_KEY_BYTES) {
      problem(
        'CLAIM_CHECK_KEY',
        `is ${bytes} bytes; use a secret of at least ${MIN_KEY_BYTES} bytes, ` +
          'e.g. CLAIM_CHECK_KEY=$(openssl rand -base64 32)',
      );
    } else {
      signingKeys = [{ id: keyIdOf(secret), secret }];
    }
  }

  let studyBytes = DEFAULT_STUDY_BYTES;
  const study = env.STUDY_BYTES;
  if (study !== undefined && study !== '') {
    studyBytes = Number(study);
    if (!/^\d+$/.test(study) || !Number.isSafeInteger(studyBytes) || studyBytes < MIN_STUDY_BYTES) {
      problem(
        'STUDY_BYTES',
        `must be a whole number of bytes, at least ${MIN_STUDY_BYTES}, got ${JSON.stringify(study)}`,
      );
    }
  }

  for (const [variable, text] of metricsEndpointProblems(env)) problem(variable, text);
  let consolePort: number | undefined;
  const port = env.CONSOLE_PORT;
  if (port !== undefined && port !== '') {
    consolePort = Number(port);
    if (!/^\d+$/.test(port) || consolePort > 65535) {
      problem(
        'CONSOLE_PORT',
        `must be a TCP port, 0 to 65535 (0 picks a free one), got ${JSON.stringify(port)}`,
      );
    }
  }

  if (problems.length > 0) throw new DemoEnvironmentError(variables, problems);
  return { broker, claimCheckAboveBytes, signingKeys, studyBytes, consolePort };
}

/**
 * The key's id, which travels in every ticket: a fingerprint of the secret (never the secret), so
 * that a consumer holding another key dead-letters tickets as signed by an unknown key, naming it,
 * rather than as a bad signature that would suggest tampering.
 */
function keyIdOf(secret: string): string {
  return `env-${createHash('sha256').update(secret, 'utf8').digest('hex').slice(0, 12)}`;
}

/** The URL schemes each server variable takes, and an example of one. */
const SERVER_URLS = {
  AMQP_URL: { schemes: ['amqp:', 'amqps:'], example: 'amqp://guest:guest@localhost:5672' },
  REDIS_URL: { schemes: ['redis:', 'rediss:'], example: 'redis://localhost:6379' },
  DATABASE_URL: {
    schemes: ['postgres:', 'postgresql:'],
    example: 'postgres://postgres@localhost:5432/test',
  },
} as const;

/** NATS takes a comma-separated list of servers, each a URL or `host:port`. */
const NATS_SCHEMES = ['nats:', 'tls:', 'ws:', 'wss:'];

/**
 * Each server variable set to something that is not a URL of its server's kind, with what to set
 * instead. The value is not echoed: it may hold a password.
 */
function serverUrlProblems(env: NodeJS.ProcessEnv): Array<[string, string]> {
  const problems: Array<[string, string]> = [];
  for (const [variable, { schemes, example }] of Object.entries(SERVER_URLS)) {
    const value = env[variable];
    if (!value) continue;
    const scheme = schemeOf(value);
    if (scheme === undefined || !(schemes as readonly string[]).includes(scheme)) {
      problems.push([
        variable,
        `must be a URL starting ${schemes.map((each) => `${each}//`).join(' or ')}, e.g. ` +
          `${example}; ` +
          `got ${scheme === undefined ? 'something that is not a URL' : `a ${scheme}// URL`}`,
      ]);
    }
  }
  const nats = env.NATS_URL;
  if (nats) {
    const servers = nats.split(',').map((server) => server.trim());
    const usable = (server: string) =>
      /^[^\s/:@]+:\d{1,5}$/.test(server) || NATS_SCHEMES.includes(schemeOf(server) ?? '');
    if (!servers.every(usable)) {
      problems.push([
        'NATS_URL',
        'must be a comma-separated list of NATS servers, each a nats://, tls://, ws:// or wss:// ' +
          'URL or host:port, e.g. nats://localhost:4222',
      ]);
    }
  }
  return problems;
}

function schemeOf(value: string): string | undefined {
  try {
    const url = new URL(value);
    return url.host === '' ? undefined : url.protocol;
  } catch {
    return undefined;
  }
}
