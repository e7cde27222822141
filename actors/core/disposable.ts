// The explicit-resource-management globals the package's declarations use (Group, Session and
// RankSession are AsyncDisposable, DeviceTensor is Disposable), declared as @types/node declares them
// (its compatibility/disposable.d.ts): a user's TypeScript then needs neither lib 'esnext.disposable'
// nor a recent @types/node for `await using group = await createGroup(...)`; the declarations merge
// with either where they are there. Node 20 has both symbols at run time.
declare global {
  interface SymbolConstructor {
    readonly dispose: unique symbol;
    readonly asyncDispose: unique symbol;
  }
  interface Disposable {
    [Symbol.dispose](): void;
  }
  interface AsyncDisposable {
    [Symbol.asyncDispose](): PromiseLike<void>;
  }
}

export {};
