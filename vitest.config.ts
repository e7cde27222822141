// Tests run from the TypeScript sources; code under test that starts workers loads the built JS in
// dist/ (npm test compiles first). The forks pool keeps each file's native addon in its own process.
import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    exclude: ['dist/**', 'node_modules/**', 'test/gpu/**'],
    pool: 'forks',
    testTimeout: 60_000,
    hookTimeout: 60_000,
  },
});
