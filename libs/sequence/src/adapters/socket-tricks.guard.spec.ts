import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Logger } from '@nestjs/common';
import {
  acceptsVersion,
  installedVersion,
  socketTricksEnabled,
  unsafeSocketTricksProblem,
} from './socket-tricks.guard';

describe('socket tricks guard', () => {
  let warn: jest.SpyInstance;

  beforeEach(() => {
    warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
  });

  afterEach(() => warn.mockRestore());

  it.each([
    ['amqplib', '0.10.0'],
    ['amqplib', '0.10.9'],
    ['ioredis', '5.0.0'],
    ['ioredis', '5.11.1'],
    ['ioredis', '5.4.0-beta.1'],
    ['@nats-io/nats-core', '3.0.0'],
    ['@nats-io/nats-core', '3.4.0'],
  ] as const)(
    'accepts %s %s, the versions the tricks were written for, silently',
    (library, version) => {
      expect(acceptsVersion(library, version, 'SomeAdapter')).toBe(true);
      expect(warn).not.toHaveBeenCalled();
    },
  );

  it.each([
    ['amqplib', '0.11.0'],
    ['amqplib', '0.9.1'],
    ['amqplib', '1.0.0'],
    ['ioredis', '6.0.0'],
    ['ioredis', '4.28.5'],
    ['ioredis', 'not a version'],
    ['@nats-io/nats-core', '2.29.3'],
    ['@nats-io/nats-core', '4.0.0'],
  ] as const)(
    'refuses %s %s with one warning naming the adapter and the known range',
    (library, version) => {
      expect(acceptsVersion(library, version, 'SomeAdapter')).toBe(false);
      expect(warn).toHaveBeenCalledTimes(1);
      const [message] = warn.mock.calls[0] as [string];
      expect(message).toContain(`${library} ${version} is installed`);
      expect(message).toContain(
        { amqplib: 'amqplib 0.10.x', ioredis: 'ioredis 5.x', '@nats-io/nats-core': '3.x' }[library],
      );
      expect(message).toContain('SomeAdapter');
    },
  );

  it('refuses a version it could not read, with one warning', () => {
    expect(acceptsVersion('ioredis', undefined, 'SomeAdapter')).toBe(false);
    expect(warn).toHaveBeenCalledTimes(1);
    expect(warn.mock.calls[0][0]).toContain('could not be read');
  });

  it('reads the installed versions from the packages', () => {
    expect(installedVersion('amqplib')).toBe(
      jest.requireActual<{ version: string }>('amqplib/package.json').version,
    );
    expect(installedVersion('ioredis')).toBe(
      jest.requireActual<{ version: string }>('ioredis/package.json').version,
    );
    // The copy the NATS client uses, its package.json found from its entry point up.
    expect(installedVersion('@nats-io/nats-core')).toBe(
      (
        JSON.parse(
          readFileSync(
            join(__dirname, '../../../../node_modules/@nats-io/nats-core/package.json'),
            'utf8',
          ),
        ) as { version: string }
      ).version,
    );
  });

  it('is off, without a warning, unless asked for', () => {
    expect(socketTricksEnabled(false, 'amqplib', 'SomeAdapter')).toBe(false);
    expect(socketTricksEnabled(false, 'ioredis', 'SomeAdapter')).toBe(false);
    expect(warn).not.toHaveBeenCalled();
  });

  it('is on when asked for on the installed amqplib 0.10, ioredis 5 and nats-core 3', () => {
    expect(socketTricksEnabled(true, 'amqplib', 'SomeAdapter')).toBe(true);
    expect(socketTricksEnabled(true, 'ioredis', 'SomeAdapter')).toBe(true);
    expect(socketTricksEnabled(true, '@nats-io/nats-core', 'SomeAdapter')).toBe(true);
    expect(warn).not.toHaveBeenCalled();
  });

  it('names an option that is not a boolean', () => {
    expect(unsafeSocketTricksProblem(undefined)).toBeUndefined();
    expect(unsafeSocketTricksProblem(true)).toBeUndefined();
    expect(unsafeSocketTricksProblem('yes')).toMatch(/unsafeSocketTricks must be true or false/);
  });
});
