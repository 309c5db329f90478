package org.libpstar;

import java.nio.FloatBuffer;
import org.libpstar.capi.PstarC;

/**
 * A parameter's fp32 master in host memory, without a copy
 * (pstar_param_pin): a direct buffer in native byte order, read-only unless
 * pinned writable (then the writes reach the compute copy when it is closed).
 * Close it to unpin; the buffer must not be used afterwards.
 */
public final class PinnedMaster extends ParamMemory {
  PinnedMaster(Engine engine, Engine.Param param, long address, boolean writable) {
    super(engine, param, address, writable);
  }

  /** The master values (read-only unless pinned writable). */
  public FloatBuffer floats() { return wrap(param.numel * 4, "unpinned").asFloatBuffer(); }

  @Override
  String describe() { return "master of " + param.name; }

  /** Unpins. */
  @Override
  void giveBack() {
    PstarException.check(PstarC.pstar_param_unpin(engine.handle(), param.id), "pstar_param_unpin");
  }
}
