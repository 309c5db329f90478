package org.libpstar;

import java.nio.ByteBuffer;
import java.nio.FloatBuffer;
import org.libpstar.capi.PstarC;

/**
 * An acquired parameter: its memory as a direct ByteBuffer in native byte
 * order (read-only unless acquired writable), on the emulated device whose
 * "device" memory is host memory. Close it to release the parameter; the
 * buffer must not be used afterwards (it then throws IllegalStateException
 * through this view's accessors; a buffer kept elsewhere cannot be stopped).
 */
public final class View extends ParamMemory {
  View(Engine engine, Engine.Param param, long address, boolean writable) {
    super(engine, param, address, writable);
  }

  /** The memory as a direct ByteBuffer (emulated device only). */
  public ByteBuffer buffer() {
    ensureOpen("released");
    if (!engine.hostMemory()) {
      throw new UnsupportedOperationException("device memory is not host memory; use address()");
    }
    return wrap(param.numel * engine.elementBytes(), "released");
  }

  /** The values as floats (f32 compute dtype only). */
  public FloatBuffer floats() {
    if (engine.computeDtype() != PstarC.PSTAR_DTYPE_F32) {
      throw new UnsupportedOperationException("the compute dtype is not f32: use buffer() (16-bit elements)");
    }
    return buffer().asFloatBuffer();
  }

  @Override
  String describe() { return "view of " + param.name; }

  /** Releases the parameter. */
  @Override
  void giveBack() {
    PstarException.check(PstarC.pstar_param_release(engine.handle(), param.id, 0), "pstar_param_release");
  }
}
