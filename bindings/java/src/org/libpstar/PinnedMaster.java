package org.libpstar;

import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import org.libpstar.capi.PstarC;

/**
 * A parameter's fp32 master in host memory, without a copy
 * (pstar_param_pin): a direct buffer in native byte order, read-only unless
 * pinned writable (then the writes reach the compute copy when it is closed).
 * Close it to unpin; the buffer must not be used afterwards.
 */
public final class PinnedMaster implements AutoCloseable {
  private final Engine engine;
  private final Engine.Param param;
  private final long address;
  private final boolean writable;
  private boolean unpinned;

  PinnedMaster(Engine engine, Engine.Param param, long address, boolean writable) {
    this.engine = engine;
    this.param = param;
    this.address = address;
    this.writable = writable;
  }

  public long address() { return address; }

  /** The master values (read-only unless pinned writable). */
  public FloatBuffer floats() {
    if (unpinned) throw new IllegalStateException("master of " + param.name + ": unpinned");
    java.nio.ByteBuffer b = PstarC.pstar_java_wrap(address, param.numel * 4).order(ByteOrder.nativeOrder());
    if (!writable) b = b.asReadOnlyBuffer().order(ByteOrder.nativeOrder());
    return b.asFloatBuffer();
  }

  /** Unpins (idempotent). */
  @Override
  public void close() {
    if (unpinned) return;
    unpinned = true;
    PstarException.check(PstarC.pstar_param_unpin(engine.handle(), param.id), "pstar_param_unpin");
  }
}
