import { SetMetadata } from '@nestjs/common';
import { SequenceOptionsError } from '../core/errors/sequence-options.error';

/**
 * A method decorator that stores a handler decorator's options on the method, as `SetMetadata`
 * does, and refuses to decorate anything but a method: on an accessor, `SetMetadata` would fail
 * with a `TypeError` without a message when the class is defined.
 * @throws SequenceOptionsError naming the decorator, the class and the member
 */
export function handlerDecorator(
  decorator: string,
  metadataKey: string,
  options: object,
): MethodDecorator {
  const setMetadata = SetMetadata(metadataKey, options);
  return <T>(
    target: object,
    key: string | symbol,
    // Undefined on a property (from JavaScript, or a decorator applied as `any`).
    descriptor: TypedPropertyDescriptor<T> | undefined,
  ): void => {
    if (typeof descriptor?.value !== 'function') {
      const type = (typeof target === 'function' ? target : target.constructor) as { name: string };
      const where = `${decorator} on ${type.name}.${String(key)}`;
      const what = descriptor?.get || descriptor?.set ? 'an accessor (get or set)' : 'a property';
      throw new SequenceOptionsError(where, [
        `${where} is on ${what}, not a method: the module calls handler methods; put it on a ` +
          'method of the class',
      ]);
    }
    setMetadata(target, key, descriptor);
  };
}
