import { InMemoryTransport } from '../adapters/transports/in-memory/in-memory.transport';
import { resolveModuleOptions } from './resolve-options';
import { MODULE_KEYS, type KeyTree } from './option-keys';

function groups(tree: KeyTree, at: string[] = []): string[][] {
  return Object.entries(tree).flatMap(([key, sub]) =>
    sub === true ? [] : [[...at, key], ...groups(sub, [...at, key])],
  );
}
function leaves(tree: KeyTree, at: string[] = []): string[][] {
  return Object.entries(tree).flatMap(([key, sub]) =>
    sub === true ? [[...at, key]] : leaves(sub, [...at, key]),
  );
}
function setPath(path: string[], value: unknown): Record<string, unknown> {
  const root: Record<string, unknown> = {};
  let node = root;
  path.forEach((key, i) => {
    if (i === path.length - 1) node[key] = value;
    else node = node[key] = {};
  });
  return root;
}
/**
 * A group of options given as anything but an object (an empty YAML key gives null) is refused
 * with a problem, never a TypeError, and never silently replaced by its defaults.
 */
describe('every option group given as null, a number, a string or true', () => {
  for (const path of groups(MODULE_KEYS)) {
    for (const value of [null, 5, 'abc', true]) {
      it(`${path.join('.')} = ${String(value)}: a problem, no throw`, () => {
        const problems: string[] = [];
        expect(() =>
          resolveModuleOptions(problems, setPath(path, value) as never, new InMemoryTransport()),
        ).not.toThrow();
        expect(problems).toContainEqual(
          expect.stringContaining(`${path.join('.')} must be an object`),
        );
      });
    }
  }
});

/**
 * An option given as null (an empty key in a YAML file, a config lookup that found nothing) is
 * refused with a problem naming it, never silently replaced by its default.
 */
describe('every option value given as null', () => {
  for (const path of leaves(MODULE_KEYS)) {
    it(`${path.join('.')} = null: a problem naming it, no throw`, () => {
      const problems: string[] = [];
      expect(() =>
        resolveModuleOptions(problems, setPath(path, null) as never, new InMemoryTransport()),
      ).not.toThrow();
      expect(problems).toContainEqual(expect.stringContaining(`${path.join('.')} `));
    });
  }
});
