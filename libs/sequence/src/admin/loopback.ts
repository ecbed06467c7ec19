import { BlockList, isIP } from 'node:net';

const LOOPBACK = new BlockList();
LOOPBACK.addSubnet('127.0.0.0', 8, 'ipv4');
LOOPBACK.addAddress('::1', 'ipv6');

/**
 * Whether a socket's remote address is this machine: 127.0.0.0/8 or `::1`, IPv4 addresses mapped
 * into IPv6 (`::ffff:127.0.0.1`) included. Only the socket's own address counts: `X-Forwarded-For`
 * and the like are written by the client, or by a proxy that then connects from loopback itself;
 * behind a proxy, supply a guard.
 */
export function isLoopbackAddress(address: string | undefined): boolean {
  if (!address) return false;
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address);
  const candidate = mapped ? mapped[1] : address;
  const family = isIP(candidate);
  if (family === 0) return false;
  return LOOPBACK.check(candidate, family === 4 ? 'ipv4' : 'ipv6');
}

/**
 * Whether a Host header names this machine: `localhost`, a 127.0.0.0/8 address or `[::1]`, with
 * an optional port. Any other name may be a DNS name rebound to 127.0.0.1 by a hostile page.
 */
export function isLoopbackHost(host: string | undefined): boolean {
  if (!host) return false;
  const match = /^(\[[^\]]+\]|[^:]+)(:\d{1,5})?$/.exec(host.trim());
  if (!match) return false;
  const name = match[1].toLowerCase().replace(/\.$/, '');
  if (name === 'localhost') return true;
  if (name.startsWith('[')) return name === '[::1]';
  return isIP(name) === 4 && LOOPBACK.check(name, 'ipv4');
}
