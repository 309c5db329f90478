package org.libpstar;

import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import org.libpstar.capi.PstarC;

/**
 * A parameter's fp32 master in host memory, without a copy
 * (pstar_param_pin): a read-only direct buffer in native byte order. Close it
 * to unpin; the buffer must not be used afterwards.
 */
public final class PinnedMaster implements AutoCloseable {
  private final Engine engine;
  private final Engine.Param param;
  private final long address;
  private boolean unpinned;

  PinnedMaster(Engine engine, Engine.Param param, long address) {
    this.engine = engine;
    this.param = param;
    this.address = address;
  }

  public long address() { return address; }

  /** The master values (read-only). */
  public FloatBuffer floats() {
    if (unpinned) throw new IllegalStateException("master of " + param.name + ": unpinned");
    return PstarC.pstar_java_wrap(address, param.numel * 4).order(ByteOrder.nativeOrder()).asReadOnlyBuffer()
        .order(ByteOrder.nativeOrder()).asFloatBuffer();
  }

  /** Unpins (idempotent). */
  @Override
  public void close() {
    if (unpinned) return;
    unpinned = true;
    PstarException.check(PstarC.pstar_param_unpin(engine.handle(), param.id), "pstar_param_unpin");
  }
}
