// Tests are the TypeScript sources under test/; tsc also emits them into dist/test, which vitest 4
// would otherwise collect too (its default exclude is only node_modules and .git).
import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
  },
});
