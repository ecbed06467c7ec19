import { ConfigurableModuleBuilder } from '@nestjs/common';
import type { SequenceModuleOptions } from './options/module-options';

export interface SequenceModuleExtras {
  /** Register the module's providers globally. @default false */
  isGlobal?: boolean;
}

export const {
  ConfigurableModuleClass: ConfigurableSequenceModule,
  MODULE_OPTIONS_TOKEN: SEQUENCE_MODULE_OPTIONS,
  OPTIONS_TYPE: SEQUENCE_OPTIONS_TYPE,
  ASYNC_OPTIONS_TYPE: SEQUENCE_ASYNC_OPTIONS_TYPE,
} = new ConfigurableModuleBuilder<SequenceModuleOptions>({
  moduleName: 'Sequence',
  // A symbol no other module can name (a string token could be looked up by anyone): the raw
  // options hold the signing and encryption keys.
  optionsInjectionToken: Symbol('nest-sequence:module-options'),
})
  .setClassMethodName('forRoot')
  .setFactoryMethodName('createSequenceOptions')
  .setExtras<SequenceModuleExtras>({ isGlobal: false }, (definition, extras) => ({
    ...definition,
    global: extras.isGlobal,
  }))
  .build();
