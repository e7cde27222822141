// Type-checks TypeScript files as a user's project would (strict, NodeNext, the package imported by
// its name 'rankflow' from inside the package, so that it resolves to the built declarations in
// dist/): the diagnostics as 'file:line message', empty when everything type-checks.
import path from 'node:path';
import ts from 'typescript';

export function typeCheck(files: string[], relativeTo: string, opts: ts.CompilerOptions = {}): string[] {
  const program = ts.createProgram(files, {
    module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext,
    target: ts.ScriptTarget.ES2022,
    lib: ['lib.es2022.d.ts'],
    types: ['node'],
    strict: true,
    noEmit: true,
    skipLibCheck: true,
    ...opts,
  });
  return ts.getPreEmitDiagnostics(program).map((d) => {
    const where = d.file ? `${path.relative(relativeTo, d.file.fileName)}:${d.file.getLineAndCharacterOfPosition(d.start ?? 0).line + 1}` : '';
    return `${where} ${ts.flattenDiagnosticMessageText(d.messageText, '\n')}`;
  });
}
