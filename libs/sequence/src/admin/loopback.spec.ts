import { isLoopbackAddress, isLoopbackHost } from './loopback';

describe('isLoopbackAddress', () => {
  it.each(['127.0.0.1', '127.10.20.30', '::1', '0:0:0:0:0:0:0:1', '::ffff:127.0.0.1'])(
    'takes %s for this machine',
    (address) => expect(isLoopbackAddress(address)).toBe(true),
  );

  it.each([
    '10.0.0.5',
    '192.168.1.1',
    '::2',
    '::ffff:10.0.0.5',
    'fe80::1',
    'localhost',
    '',
    undefined,
  ])('takes %s for another machine', (address) => expect(isLoopbackAddress(address)).toBe(false));
});

describe('isLoopbackHost', () => {
  it.each(['localhost', 'localhost:3000', 'LocalHost.', '127.0.0.1:80', '127.9.8.7', '[::1]:3000'])(
    'takes Host %s for this machine',
    (host) => expect(isLoopbackHost(host)).toBe(true),
  );

  it.each([
    'evil.example',
    'localhost.evil.example:3000',
    '127.0.0.1.nip.io',
    '10.0.0.5:3000',
    '[::2]',
    '::1',
    '',
    undefined,
  ])('takes Host %s for another machine', (host) => expect(isLoopbackHost(host)).toBe(false));
});
