import {
  isReplyChannel,
  isValidJetStreamName,
  leaseStreamName,
  leaseSubject,
  MAX_STREAM_NAME_CHARS,
  partitionConsumerName,
  partitionStreamName,
  partitionSubject,
  replyStreamName,
  streamName,
  subjectProblem,
  MAX_CHANNEL_BYTES,
} from './nats.naming';

describe('NATS naming', () => {
  it('escapes every character a stream name may not hold as _XX, keeping letters, digits and -', () => {
    expect(streamName('NSEQ_', 'orders.v1')).toBe('NSEQ_orders_2Ev1');
    expect(streamName('NSEQ_', 'a_b c/d>é')).toBe('NSEQ_a_5Fb_20c_2Fd_3E_C3_A9');
    expect(isValidJetStreamName(streamName('NSEQ_', 'a.*>/\\ \tb'))).toBe(true);
  });

  it('maps distinct channels to distinct streams, "_" included', () => {
    expect(streamName('', 'a.b')).not.toBe(streamName('', 'a_2Eb'));
  });

  it('shortens a long name to its start and a hash of the whole channel', () => {
    const long = `imaging.${'x'.repeat(300)}`;
    const name = streamName('NSEQ_', long);
    expect(name).toHaveLength(MAX_STREAM_NAME_CHARS);
    expect(name).toMatch(/^NSEQ_imaging_2Exxx.*_[0-9a-f]{16}$/);
    expect(streamName('NSEQ_', `${long}y`)).not.toBe(name);
  });

  it('takes a channel as its subject only when it is a literal NATS subject', () => {
    expect(subjectProblem('imaging.ai.intake.dlq')).toBeUndefined();
    for (const bad of ['', 'a..b', '.a', 'a.', 'a.*.b', 'a.>', 'a b', 'a\tb']) {
      expect({ bad, problem: subjectProblem(bad) }).toEqual({ bad, problem: expect.any(String) });
    }
  });

  it('takes a channel of at most MAX_CHANNEL_BYTES bytes of UTF-8', () => {
    expect(subjectProblem('x'.repeat(MAX_CHANNEL_BYTES))).toBeUndefined();
    expect(subjectProblem('x'.repeat(MAX_CHANNEL_BYTES + 1))).toMatch(/more than 1024/);
    // 512 two-byte characters are 1,024 bytes; one more is over.
    expect(subjectProblem('é'.repeat(512))).toBeUndefined();
    expect(subjectProblem('é'.repeat(513))).toMatch(/1026 bytes long/);
  });

  it('names the reply stream so that no channel maps to it', () => {
    expect(replyStreamName('NSEQ_')).toBe('NSEQ__REPLY');
    expect(isValidJetStreamName(replyStreamName('NSEQ_'))).toBe(true);
    for (const channel of ['REPLY', '_REPLY', '.REPLY', 'nseq-reply']) {
      expect(streamName('NSEQ_', channel)).not.toBe(replyStreamName('NSEQ_'));
    }
    expect(isReplyChannel('nseq-reply.5f0c')).toBe(true);
    expect(isReplyChannel('nseq-replyx.5f0c')).toBe(false);
  });

  it("names a partitioned channel's subjects, consumers and streams", () => {
    expect(partitionSubject('orders.v1', 3)).toBe('orders.v1.partition.3');
    expect(leaseSubject('orders.v1', 3)).toBe('nseq-lease.orders.v1.3');
    expect(partitionConsumerName('nest-sequence', 3)).toBe('nest-sequence-p3');
    expect(partitionStreamName('NSEQ_', 'orders.v1')).toBe('NSEQ_orders_2Ev1_PARTITIONS');
    expect(leaseStreamName('NSEQ_', 'orders.v1')).toBe('NSEQ_orders_2Ev1_LEASES');
  });

  it('keeps partition and lease streams apart from every channel stream', () => {
    for (const channel of ['orders_PARTITIONS', 'orders.PARTITIONS', 'orders_LEASES']) {
      expect(streamName('NSEQ_', channel)).not.toBe(partitionStreamName('NSEQ_', 'orders'));
      expect(streamName('NSEQ_', channel)).not.toBe(leaseStreamName('NSEQ_', 'orders'));
    }
  });

  it('shortens a long partitioned channel within the limit, its suffix kept', () => {
    const long = `imaging.${'x'.repeat(300)}`;
    for (const name of [partitionStreamName('NSEQ_', long), leaseStreamName('NSEQ_', long)]) {
      expect(name.length).toBeLessThanOrEqual(MAX_STREAM_NAME_CHARS);
      expect(name).toMatch(/_[0-9a-f]{16}_(PARTITIONS|LEASES)$/);
      expect(isValidJetStreamName(name)).toBe(true);
    }
  });
});
