# Fits a linear map with its weights in libpstar chunks (emulated device,
# f32).  NOT RUN: Julia is not installable where this project is built (see
# ../README.md).  Run with: JULIA_PSTAR_LIBRARY=<build>/lib/libpstar.so julia --project=.. linear.jl
using Pstar

const N = 16
const B = 32
e = Engine(chunk_elems = UInt64(1024), compute_dtype = Pstar.PSTAR_DTYPE_F32, lr = 1f-2, weight_decay = 0f0)
w = register!(e, "w", Int64[N, N])
build!(e)
write!(e, w, zeros(Float32, N * N))
x = randn(Float32, B, N)
target = randn(Float32, N, N)
y = x * target
for it in 1:200
    begin_train!(e)
    W = reshape(acquire(e, w, Pstar.PSTAR_STAGE_FORWARD), N, N)
    err = x * W - y
    release!(e, w)
    acquire(e, w, Pstar.PSTAR_STAGE_BACKWARD)
    grad_write!(e, w, vec(2f0 .* (x' * err) ./ length(err)))
    release!(e, w)
    step!(e)
    it % 50 == 0 && println("step $it  loss $(sum(abs2, err) / length(err))")
end
close(e)
