// @ts-check
import eslint from '@eslint/js';
import tseslint from 'typescript-eslint';
import prettier from 'eslint-config-prettier';
import importX from 'eslint-plugin-import-x';
import { createTypeScriptImportResolver } from 'eslint-import-resolver-typescript';

const lib = 'libs/sequence/src';
const PATTERNS = ['sequence', 'claim-check', 'resequencer', 'outbox'];
/** The library's entry points (index.ts and one file per subpath), at the root of `lib`. */
const ENTRIES = `${lib}/*.ts`;

/**
 * The library's layers, as import-x/no-restricted-paths zones: a pattern depends on the kernel,
 * core/, options/ and the ports only, never on another pattern, an adapter or the integrations;
 * the kernel on no pattern; core/ on nothing but itself; the demo on the package's entry points.
 * The module (sequence.module.ts, sequence.adapters.ts) is the one place that composes them all.
 */
const zones = [
  ...PATTERNS.map((pattern) => ({
    target: `${lib}/${pattern}`,
    from: [
      ...PATTERNS.filter((other) => other !== pattern).map((other) => `${lib}/${other}/**`),
      `${lib}/adapters/**`,
      `${lib}/observability/**`,
      `${lib}/testing/**`,
      ENTRIES,
    ],
    message: 'a pattern depends on the kernel, core/, options/ and the ports only',
  })),
  {
    target: `${lib}/kernel`,
    from: [
      ...PATTERNS.map((p) => `${lib}/${p}/**`),
      `${lib}/adapters/**`,
      `${lib}/observability/**`,
      ENTRIES,
    ],
    message: 'the kernel depends on no pattern and no adapter',
  },
  {
    target: `${lib}/options`,
    from: [
      ...PATTERNS.map((p) => `${lib}/${p}/**`),
      `${lib}/kernel/**`,
      `${lib}/adapters/**`,
      ENTRIES,
    ],
    message: 'options/ depends on core/ and the ports only',
  },
  {
    target: `${lib}/discovery`,
    from: [
      ...PATTERNS.map((p) => `${lib}/${p}/**`),
      `${lib}/kernel/**`,
      `${lib}/adapters/**`,
      ENTRIES,
    ],
    message: 'decorators only write metadata: they depend on options/ types only',
  },
  {
    target: `${lib}/ports`,
    from: [`${lib}/!(core|ports)/**`, ENTRIES],
    message: 'a port depends on core/ only',
  },
  {
    target: `${lib}/core`,
    from: [`${lib}/!(core)/**`, ENTRIES],
    message: 'core/ is pure: it depends on nothing of the library',
  },
  {
    target: `${lib}/adapters`,
    from: [
      ...PATTERNS.map((p) => `${lib}/${p}/**`),
      `${lib}/kernel/**`,
      `${lib}/options/**`,
      `${lib}/discovery/**`,
      `${lib}/observability/**`,
      ENTRIES,
    ],
    message: 'an adapter depends on core/ and the ports only',
  },
];

export default tseslint.config(
  { ignores: ['dist/**', 'node_modules/**', 'coverage/**', 'eslint.config.mjs'] },
  eslint.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  prettier,
  {
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      '@typescript-eslint/no-unused-vars': [
        'error',
        { argsIgnorePattern: '^_', varsIgnorePattern: '^_' },
      ],
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/require-await': 'off',
      '@typescript-eslint/no-extraneous-class': 'off',
      '@typescript-eslint/unbound-method': 'off',
    },
  },
  {
    files: [`${lib}/**/*.ts`, 'src/**/*.ts'],
    ignores: ['**/*.spec.ts'],
    plugins: { 'import-x': importX },
    settings: {
      'import-x/resolver-next': [createTypeScriptImportResolver({ project: 'tsconfig.json' })],
      // import-x/no-cycle follows imports by parsing each dependency: TypeScript files too.
      'import-x/parsers': { '@typescript-eslint/parser': ['.ts'] },
      'import-x/extensions': ['.ts', '.js'],
    },
    rules: {
      'import-x/no-cycle': 'error',
      'import-x/no-restricted-paths': ['error', { zones }],
    },
  },
  {
    files: ['src/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [
            {
              group: ['**/libs/**'],
              message:
                "the demo uses the library as a user does: import from 'nest-sequence' and its subpaths",
            },
          ],
        },
      ],
    },
  },
  {
    files: [
      '**/*.spec.ts',
      '**/*.e2e-spec.ts',
      'test/**/*.ts',
      'libs/sequence/test/**/*.ts',
      // The conformance suites that nest-sequence/testing ships are tests too.
      'libs/sequence/src/testing/**/*.ts',
    ],
    rules: {
      '@typescript-eslint/no-unsafe-assignment': 'off',
      '@typescript-eslint/no-unsafe-member-access': 'off',
      '@typescript-eslint/no-non-null-assertion': 'off',
    },
  },
);
