/**
 * Jest: unit and conformance specs next to the library, end-to-end specs in test/. `nest-sequence`
 * and its subpaths resolve to the library's entry points, as the package's exports map does.
 */
const common = {
  transform: { '^.+\\.ts$': ['ts-jest', { tsconfig: 'tsconfig.json' }] },
  moduleFileExtensions: ['ts', 'js', 'json'],
  moduleNameMapper: {
    '^nest-sequence$': '<rootDir>/libs/sequence/src/index.ts',
    '^nest-sequence/(rabbitmq|nats|microservices|redis|postgres|sqlite|s3|health|admin|testing|wire|ports)$': '<rootDir>/libs/sequence/src/$1.ts',
  },
  testEnvironment: 'node',
  // Build output: `npm run package` stages a second package.json named nest-sequence there.
  modulePathIgnorePatterns: ['<rootDir>/dist/'],
};

module.exports = {
  testTimeout: 60000,
  reporters: ['default', '<rootDir>/test/support/slowest-files.reporter.js'],
  projects: [
    { ...common, displayName: 'unit', testMatch: ['<rootDir>/libs/**/*.spec.ts'] },
    { ...common, displayName: 'e2e', testMatch: ['<rootDir>/test/**/*.e2e-spec.ts'] },
  ],
};
