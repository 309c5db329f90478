package org.libpstar;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import org.libpstar.capi.PstarC;

/**
 * A parameter's memory handed out by the engine until it is closed: an
 * acquired parameter ({@link View}) or a pinned fp32 master
 * ({@link PinnedMaster}). Closing gives it back (idempotent); buffers
 * obtained from it must not be used afterwards (its accessors then throw
 * IllegalStateException; a buffer kept elsewhere cannot be stopped).
 */
public abstract class ParamMemory implements AutoCloseable {
  final Engine engine;
  final Engine.Param param;
  private final long address;
  private final boolean writable;
  private boolean closed;

  ParamMemory(Engine engine, Engine.Param param, long address, boolean writable) {
    this.engine = engine;
    this.param = param;
    this.address = address;
    this.writable = writable;
  }

  /** The address of the memory (device memory for a View on CUDA). */
  public long address() { return address; }

  /** Whether the memory may be written through its buffers. */
  public boolean writable() { return writable; }

  /**
   * `bytes` of the memory as a direct buffer in native byte order,
   * read-only unless writable; `state` names what closing did ("released",
   * "unpinned") for the exception after close.
   */
  ByteBuffer wrap(long bytes, String state) {
    ensureOpen(state);
    ByteBuffer b = PstarC.pstar_java_wrap(address, bytes).order(ByteOrder.nativeOrder());
    return writable ? b : b.asReadOnlyBuffer().order(ByteOrder.nativeOrder());
  }

  /** Throws IllegalStateException ("view of w1: released") once closed. */
  void ensureOpen(String state) {
    if (closed) throw new IllegalStateException(describe() + ": " + state);
  }

  /** What this memory is, for messages ("view of w1"). */
  abstract String describe();

  /** Gives the memory back to the engine (called once, by close()). */
  abstract void giveBack();

  /** Gives the memory back (idempotent). */
  @Override
  public final void close() {
    if (closed) return;
    closed = true;
    giveBack();
  }
}
