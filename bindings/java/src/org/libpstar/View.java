package org.libpstar;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import org.libpstar.capi.PstarC;

/**
 * An acquired parameter: its memory as a direct ByteBuffer in native byte
 * order (read-only unless acquired writable), on the emulated device whose
 * "device" memory is host memory. Close it to release the parameter; the
 * buffer must not be used afterwards (it then throws IllegalStateException
 * through this view's accessors; a buffer kept elsewhere cannot be stopped).
 */
public final class View implements AutoCloseable {
  private final Engine engine;
  private final Engine.Param param;
  private final long address;
  private final boolean writable;
  private boolean released;

  View(Engine engine, Engine.Param param, long address, boolean writable) {
    this.engine = engine;
    this.param = param;
    this.address = address;
    this.writable = writable;
  }

  /** The address of the memory (device memory on CUDA). */
  public long address() { return address; }

  /** The memory as a direct ByteBuffer (emulated device only). */
  public ByteBuffer buffer() {
    if (released) throw new IllegalStateException("view of " + param.name + ": released");
    if (!engine.hostMemory()) {
      throw new UnsupportedOperationException("device memory is not host memory; use address()");
    }
    ByteBuffer b = PstarC.pstar_java_wrap(address, param.numel * engine.elementBytes()).order(ByteOrder.nativeOrder());
    return writable ? b : b.asReadOnlyBuffer().order(ByteOrder.nativeOrder());
  }

  /** The values as floats (f32 compute dtype only). */
  public FloatBuffer floats() {
    if (engine.computeDtype() != PstarC.PSTAR_DTYPE_F32) {
      throw new UnsupportedOperationException("the compute dtype is not f32: use buffer() (16-bit elements)");
    }
    return buffer().asFloatBuffer();
  }

  /** Releases the parameter (idempotent). */
  @Override
  public void close() {
    if (released) return;
    released = true;
    PstarException.check(PstarC.pstar_param_release(engine.handle(), param.id, 0), "pstar_param_release");
  }
}
