package org.libpstar;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import org.libpstar.capi.PstarC;
import org.libpstar.capi.pstar_step_result;
import org.libpstar.capi.pstar_stats;

/**
 * A libpstar engine. Close it (try-with-resources) to destroy it; every
 * failing call throws a {@link PstarException} subclass. Not thread-safe,
 * like the engine itself.
 */
public final class Engine implements AutoCloseable {
  static {
    Native.load();
  }

  /** Stage of a parameter use. */
  public enum Stage {
    FORWARD(PstarC.PSTAR_STAGE_FORWARD),
    BACKWARD(PstarC.PSTAR_STAGE_BACKWARD),
    RECOMPUTE(PstarC.PSTAR_STAGE_RECOMPUTE);

    final int value;

    Stage(int value) { this.value = value; }
  }

  /** A registered parameter. */
  public static final class Param {
    public final int id;
    public final String name;
    public final long numel;

    Param(int id, String name, long numel) {
      this.id = id;
      this.name = name;
      this.numel = numel;
    }

    @Override
    public String toString() { return "Param(" + name + ", " + numel + " elements)"; }
  }

  /** What a step did. */
  public static final class StepResult {
    public final long step;
    public final boolean skipped;
    public final long paramsUpdated;
    public final double gradNorm;

    StepResult(long step, boolean skipped, long paramsUpdated, double gradNorm) {
      this.step = step;
      this.skipped = skipped;
      this.paramsUpdated = paramsUpdated;
      this.gradNorm = gradNorm;
    }
  }

  private long handle;
  private boolean closed;
  private final int computeDtype;
  private final boolean hostMemory;

  public Engine(Options options) {
    long[] out = new long[1];
    PstarException.check(PstarC.pstar_engine_create(options.raw(), out), "pstar_engine_create");
    handle = out[0];
    computeDtype = options.raw().getCompute_dtype();
    hostMemory = options.raw().getDevice() == PstarC.PSTAR_DEVICE_EMULATED;
  }

  /**
   * Destroys the engine (idempotent). Later calls pass the destroyed handle
   * on, and the library answers PSTAR_ERR_INVALID_HANDLE.
   */
  @Override
  public void close() {
    if (closed) return;
    closed = true;
    PstarException.check(PstarC.pstar_engine_destroy(handle), "pstar_engine_destroy");
  }

  public int computeDtype() { return computeDtype; }

  /** Bytes per element of the compute dtype. */
  public int elementBytes() { return computeDtype == PstarC.PSTAR_DTYPE_F32 ? 4 : 2; }

  boolean hostMemory() { return hostMemory; }

  long handle() { return handle; }

  public Param register(String name, long... shape) { return register(name, false, shape); }

  public Param register(String name, boolean frozen, long... shape) {
    long[] id = new long[1];
    PstarException.check(
        PstarC.pstar_param_register(handle, name, shape, frozen ? PstarC.PSTAR_PARAM_FROZEN : 0, id),
        "pstar_param_register");
    long numel = 1;
    for (long d : shape) numel *= d;
    return new Param((int) id[0], name, numel);
  }

  public void build() { PstarException.check(PstarC.pstar_engine_build(handle), "pstar_engine_build"); }

  public Param find(String name) {
    long[] id = new long[1];
    PstarException.check(PstarC.pstar_param_find(handle, name, id), "pstar_param_find");
    long[] numel = new long[1];
    PstarException.check(PstarC.pstar_param_numel(handle, id[0], numel), "pstar_param_numel");
    return new Param((int) id[0], name, numel[0]);
  }

  private static ByteBuffer direct(int floats) {
    return ByteBuffer.allocateDirect(floats * 4).order(ByteOrder.nativeOrder());
  }

  /** Writes the values (the library checks the count). */
  public void write(Param p, float[] values) {
    ByteBuffer b = direct(values.length);
    b.asFloatBuffer().put(values);
    PstarException.check(PstarC.pstar_param_write(handle, p.id, b, values.length, PstarC.PSTAR_DTYPE_F32),
                         "pstar_param_write");
  }

  /** Reads the values (the library checks the count). */
  public void read(Param p, float[] out) {
    ByteBuffer b = direct(out.length);
    PstarException.check(PstarC.pstar_param_read(handle, p.id, b, out.length, PstarC.PSTAR_DTYPE_F32),
                         "pstar_param_read");
    b.asFloatBuffer().get(out);
  }

  /**
   * The parameter's fp32 master in place (pstar_param_pin), read-only; close
   * the returned view to unpin. While pinned, a step that would update the
   * parameter throws {@link PstarException.Busy}.
   */
  public PinnedMaster pin(Param p) { return pin(p, false); }

  /**
   * A writable pin (outside iterations only): the writes reach the compute
   * copy when the view is closed.
   */
  public PinnedMaster pin(Param p, boolean writable) {
    long[] ptr = new long[1];
    int[] dtype = new int[1];
    PstarException.check(PstarC.pstar_param_pin(handle, p.id, writable ? 1 : 0, ptr, dtype), "pstar_param_pin");
    return new PinnedMaster(this, p, ptr[0], writable);
  }

  /** Saves a checkpoint into `dir` (pstar_checkpoint_save). */
  public void saveCheckpoint(String dir) {
    PstarException.check(PstarC.pstar_checkpoint_save(handle, dir), "pstar_checkpoint_save");
  }

  /** Loads the checkpoint `dir`/LATEST names (pstar_checkpoint_load). */
  public void loadCheckpoint(String dir) {
    PstarException.check(PstarC.pstar_checkpoint_load(handle, dir), "pstar_checkpoint_load");
  }

  /** Writes every parameter's fp32 values as a safetensors file. */
  public void exportSafetensors(String path) {
    PstarException.check(PstarC.pstar_export_safetensors(handle, path), "pstar_export_safetensors");
  }

  public void beginTrain() {
    PstarException.check(PstarC.pstar_iteration_begin(handle, PstarC.PSTAR_ITERATION_TRAIN), "pstar_iteration_begin");
  }

  public void beginEval() {
    PstarException.check(PstarC.pstar_iteration_begin(handle, PstarC.PSTAR_ITERATION_EVAL), "pstar_iteration_begin");
  }

  public void endIteration() {
    PstarException.check(PstarC.pstar_iteration_end(handle), "pstar_iteration_end");
  }

  /**
   * Ends the current TRAIN or EVAL iteration without a step
   * (pstar_iteration_abort), e.g. from a catch block: releases what is still
   * acquired, discards the iteration's gradients, and leaves the parameters,
   * the optimizer state, the step count, the loss scale and the trace as if
   * the iteration had never begun.
   */
  public void abortIteration() {
    PstarException.check(PstarC.pstar_iteration_abort(handle), "pstar_iteration_abort");
  }

  /** Acquires a parameter for a use: a View to close (it releases). */
  public View acquire(Param p, Stage stage) { return acquire(p, stage, false); }

  public View acquire(Param p, Stage stage, boolean writable) {
    long[] ptr = new long[1];
    PstarException.check(PstarC.pstar_param_acquire(handle, p.id, stage.value, 0, ptr), "pstar_param_acquire");
    return new View(this, p, ptr[0], writable);
  }

  /** Adds a gradient (between the backward acquire and its release). */
  public void gradWrite(Param p, float[] grad) {
    ByteBuffer b = direct(grad.length);
    b.asFloatBuffer().put(grad);
    PstarException.check(PstarC.pstar_grad_write(handle, p.id, b, grad.length, PstarC.PSTAR_DTYPE_F32,
                                                 PstarC.PSTAR_MEM_HOST, 0),
                         "pstar_grad_write");
  }

  /** Ends the TRAIN iteration with Adam. */
  public StepResult step() {
    pstar_step_result r = new pstar_step_result();
    PstarException.check(PstarC.pstar_step_result_init(r), "pstar_step_result_init");
    PstarException.check(PstarC.pstar_step(handle, r), "pstar_step");
    return new StepResult(r.getStep(), r.getSkipped() != 0, r.getParams_updated(), r.getGrad_norm());
  }

  /** The engine's statistics (pstar_stats, fields as getters). */
  public pstar_stats stats() {
    pstar_stats s = new pstar_stats();
    PstarException.check(PstarC.pstar_stats_init(s), "pstar_stats_init");
    PstarException.check(PstarC.pstar_engine_get_stats(handle, s), "pstar_engine_get_stats");
    return s;
  }

  /**
   * Routes the library's log to `handler` (null: back to stderr) for
   * records at `minLevel` (PstarC.PSTAR_LOG_*) and above. Process-wide.
   */
  public static void setLogHandler(LogHandler handler, int minLevel) {
    Native.load();
    PstarException.check(PstarC.pstar_java_set_log_handler(handler, minLevel), "pstar_log_set_callback");
  }

  /** The library's version string. */
  public static String version() {
    Native.load();
    return PstarC.pstar_version_string();
  }

  /** Floats of a direct buffer, for convenience. */
  static FloatBuffer floats(ByteBuffer b) { return b.order(ByteOrder.nativeOrder()).asFloatBuffer(); }
}
