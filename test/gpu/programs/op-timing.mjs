// Rank program of test/gpu/moe.test.mjs: rank.timeOps() and lastOpDeviceMs(). Ops are not timed by
// default (STATE), then a dispatch and a combine are (a positive time, below the op's wall time),
// and after timeOps(false) again not. Returns what each step gave.
import { MOE_BUFFER, combineInput, moeInput, deviceMoeInput } from '../moe-inputs.mjs';

const attempt = (fn) => {
    try {
        return { ms: fn() };
    } catch (e) {
        return { code: e.code, message: e.message };
    }
};

export default async function opTiming(rank, { seed, tokens }) {
    const T = tokens[rank.rank];
    const { x, topkIdx, topkWeights } = deviceMoeInput(rank, moeInput(seed, rank.rank, T), T);
    const d = await rank.dispatch({ x, topkIdx, topkWeights });
    const before = attempt(() => rank.lastOpDeviceMs());
    const badArg = attempt(() => rank.timeOps('yes'));
    rank.timeOps(true);
    const armed = attempt(() => rank.lastOpDeviceMs());
    let t0 = performance.now();
    await rank.dispatch({ x, handle: d.handle }, { outputsInBuffer: true });  // its outputs are the buffer's views
    await rank.sync();
    const dispatchWallMs = performance.now() - t0;
    const dispatched = attempt(() => rank.lastOpDeviceMs());
    const cx = rank.tensor('bf16', [d.numRecv, MOE_BUFFER.hidden], combineInput(seed, rank.rank, d.numRecv).x);
    t0 = performance.now();
    const c = await rank.combine({ x: cx, handle: d.handle });
    await rank.sync();
    const combineWallMs = performance.now() - t0;
    const combined = attempt(() => rank.lastOpDeviceMs());
    rank.timeOps(false);
    const after = attempt(() => rank.lastOpDeviceMs());
    for (const t of [x, topkIdx, topkWeights, cx, c.x, c.topkWeights]) t.free();
    d.free();
    return { before, badArg, armed, dispatched, dispatchWallMs, combined, combineWallMs, after };
}
