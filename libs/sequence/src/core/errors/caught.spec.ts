import { asError, errorMessage, textOf } from './caught';

describe('describing what a catch clause caught', () => {
  const bare = Object.assign(Object.create(null) as object, { code: 'E_DOWNSTREAM' });
  const selfish = { toString: () => ({}) };

  it('gives String() of what String() converts', () => {
    expect(textOf('down')).toBe('down');
    expect(textOf(42)).toBe('42');
    expect(textOf(undefined)).toBe('undefined');
    expect(textOf(Symbol('s'))).toBe('Symbol(s)');
  });

  it('gives the JSON of an object String() throws on', () => {
    expect(() => String(bare as unknown)).toThrow(TypeError);
    expect(textOf(bare)).toBe('{"code":"E_DOWNSTREAM"}');
    expect(errorMessage(bare)).toBe('{"code":"E_DOWNSTREAM"}');
    expect(asError(bare).message).toBe('{"code":"E_DOWNSTREAM"}');
    // Its toString returns no text: String() throws, JSON has no own fields to give.
    expect(textOf(selfish)).toBe('{}');
  });

  it('gives the type tag when neither String() nor JSON can', () => {
    const cyclic = Object.create(null) as { self?: unknown };
    cyclic.self = cyclic;
    expect(textOf(cyclic)).toBe('[object Object]');
  });
});
