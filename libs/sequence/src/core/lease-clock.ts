/**
 * The clocks a lease holder counts its lease's time left on. A lease runs on a server's clock
 * (Redis's, NATS's `max_age`); the holder, which cannot ask it at every step, counts locally on
 * two clocks and believes the lease lapsed as soon as either says so: a monotonic one
 * (`performance.now`), which no step of the wall clock moves (an NTP step back), and the wall
 * clock (`Date.now`), which keeps counting while the machine or virtual machine is suspended
 * (where the monotonic one stops, though the server's clock went on).
 */

/** An instant on both clocks. */
export interface LeaseInstant {
  readonly mono: number;
  readonly wall: number;
}

/** Now, on both clocks. */
export function leaseClock(): LeaseInstant {
  return { mono: performance.now(), wall: Date.now() };
}

/** `instant` plus `ms`, on both clocks. */
export function leaseLater(instant: LeaseInstant, ms: number): LeaseInstant {
  return { mono: instant.mono + ms, wall: instant.wall + ms };
}

/** The later of two instants, clock by clock. */
export function leaseLatest(a: LeaseInstant, b: LeaseInstant): LeaseInstant {
  return { mono: Math.max(a.mono, b.mono), wall: Math.max(a.wall, b.wall) };
}

/** Milliseconds until `until` by the clock that has the fewer left (negative once past). */
export function leaseMsLeft(until: LeaseInstant, now: LeaseInstant = leaseClock()): number {
  return Math.min(until.mono - now.mono, until.wall - now.wall);
}

/**
 * Milliseconds since `start` by the clock that has counted more: for a local deadline that must
 * hold on both (a wall clock stepped back, a machine suspended).
 */
export function msSince(start: LeaseInstant, now: LeaseInstant = leaseClock()): number {
  return Math.max(now.mono - start.mono, now.wall - start.wall);
}
