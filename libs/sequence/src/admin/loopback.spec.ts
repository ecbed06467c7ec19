import { isLoopbackAddress } from './loopback';

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
