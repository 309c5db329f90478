package org.libpstar;

import org.libpstar.capi.PstarC;
import org.libpstar.capi.pstar_engine_options;

/**
 * Engine options: the library's defaults (pstar_engine_options_init), set
 * through fluent methods or raw() for any field.
 */
public final class Options {
  static {
    Native.load();
  }

  private final pstar_engine_options raw = new pstar_engine_options();

  public Options() {
    PstarException.check(PstarC.pstar_engine_options_init(raw), "pstar_engine_options_init");
  }

  public pstar_engine_options raw() { return raw; }

  public Options emulated() {
    raw.setDevice(PstarC.PSTAR_DEVICE_EMULATED);
    return this;
  }

  public Options cuda(int ordinal) {
    raw.setDevice(PstarC.PSTAR_DEVICE_CUDA);
    raw.setDevice_ordinal(ordinal);
    return this;
  }

  public Options deviceCapacity(long bytes) {
    raw.setDevice_capacity_bytes(bytes);
    return this;
  }

  public Options chunkElems(long elems) {
    raw.setChunk_elems(elems);
    return this;
  }

  /** PstarC.PSTAR_DTYPE_F32, _F16 or _BF16. */
  public Options computeDtype(int dtype) {
    raw.setCompute_dtype(dtype);
    return this;
  }

  public Options lr(float lr) {
    raw.setLr(lr);
    return this;
  }

  public Options weightDecay(float wd) {
    raw.setWeight_decay(wd);
    return this;
  }

  /** The format of Adam's moments, fixed for the engine's life:
   *  PstarC.PSTAR_STATE_FP32 (the default), _BF16 or _INT8. */
  public Options stateFormat(int format) {
    raw.setState_format(format);
    return this;
  }

  /** The format of the master weights, fixed for the engine's life:
   *  PstarC.PSTAR_MASTER_FP32 (the default) or _BF16 (stochastic rounding
   *  with random bits from {@code seed}, the step and the element). */
  public Options masterFormat(int format, long seed) {
    raw.setMaster_format(format);
    raw.setMaster_seed(seed);
    return this;
  }
}
