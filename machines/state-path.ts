// The dotted path of an xstate snapshot value, the form in which ranks report their states.
/** The dotted path of a snapshot value: 'ready', 'dispatching.cpuSync', 'session.open'. */
export function statePath(value: unknown): string {
  if (typeof value === 'string') return value;
  if (value && typeof value === 'object') {
    const [key, inner] = Object.entries(value as Record<string, unknown>)[0] ?? [];
    if (key === undefined) return '';
    const rest = statePath(inner);
    return rest ? `${key}.${rest}` : key;
  }
  return '';
}
