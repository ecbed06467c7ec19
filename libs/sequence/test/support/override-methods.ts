/**
 * `target` with some of its methods replaced (to inject faults into an adapter a test hands to
 * the module); every other property is the target's own, its methods bound to it, so private
 * state and `this` keep working.
 */
export function overrideMethods<T extends object>(target: T, overrides: Partial<T>): T {
  return new Proxy(target, {
    get: (object, property) => {
      if (Object.prototype.hasOwnProperty.call(overrides, property)) {
        return overrides[property as keyof T];
      }
      const value: unknown = Reflect.get(object, property, object);
      return typeof value === 'function' ? (value as () => unknown).bind(object) : value;
    },
  });
}
