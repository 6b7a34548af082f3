"""Streams and events: torch.openreg.Stream/Event over the device guard."""

import threading
import time

import torch
import torch_openreg
from conftest import run_python
from torch.testing._internal.common_utils import TestCase, run_tests
from torch_openreg.utils.testing import StreamHold, raw_kernel_team_size


def slow_work(n: int = 384) -> torch.Tensor:
    """Queues enough device work that it is still running when the host checks."""
    a = torch.randn(n, n, device="openreg")
    for _ in range(8):
        a = a @ a / n
    return a


class TestStreams(TestCase):
    def test_default_and_current(self):
        s = torch.openreg.current_stream()
        self.assertEqual(s, torch.openreg.default_stream())
        self.assertEqual(s.stream_id, 0)
        self.assertEqual(s.device, torch.device("openreg:0"))
        self.assertEqual(torch.openreg.default_stream(1).device, torch.device("openreg:1"))

    def test_stream_context_and_set_stream(self):
        s = torch.openreg.Stream()
        self.assertNotEqual(s, torch.openreg.default_stream())
        with torch.openreg.stream(s):
            self.assertEqual(torch.openreg.current_stream(), s)
        self.assertEqual(torch.openreg.current_stream(), torch.openreg.default_stream())
        torch.openreg.set_stream(s)
        self.assertEqual(torch.openreg.current_stream(), s)
        torch.openreg.set_stream(torch.openreg.default_stream())

    def test_set_stream_makes_the_stream_device_current(self):
        # As torch.cuda.set_stream: left on device 0, the work that follows would ignore the stream.
        s1 = torch.openreg.Stream(device=1)
        try:
            torch.openreg.set_stream(s1)
            self.assertEqual(torch.openreg.current_device(), 1)
            self.assertEqual(torch.openreg.current_stream(), s1)
            self.assertEqual(torch.ones(1, device="openreg").device, torch.device("openreg:1"))
        finally:
            torch.openreg.set_stream(torch.openreg.default_stream(1))
            torch.openreg.set_stream(torch.openreg.default_stream(0))  # and back to device 0
        self.assertEqual(torch.openreg.current_device(), 0)
        self.assertEqual(torch.openreg.current_stream(1), torch.openreg.default_stream(1))

    def test_streams_hash_as_torch_streams(self):
        # Equal to the torch.Stream of the same stream, so the hashes must agree (sets, dict keys).
        a, b = torch.openreg.current_stream(), torch.accelerator.current_stream()
        self.assertEqual(a, b)
        self.assertEqual(hash(a), hash(b))
        self.assertIn(b, {a})
        self.assertEqual(len({a, b, torch.openreg.Stream()}), 2)

    def test_wrong_stream_types_are_named(self):
        cpu_stream = torch.Stream(device="cpu")
        with self.assertRaisesRegex(ValueError, "Expected an openreg stream, got a stream of device cpu"):
            torch.openreg.stream(cpu_stream).__enter__()
        with self.assertRaisesRegex(ValueError, "Expected an openreg stream, got a stream of device cpu"):
            torch.openreg.set_stream(cpu_stream)
        self.assertEqual(torch.openreg.current_device(), 0)
        self.assertEqual(torch.openreg.current_stream(), torch.openreg.default_stream())

    def test_set_stream_refuses_an_unknown_stream(self):
        # A made-up stream id used to be accepted, and then every op on the thread failed.
        with self.assertRaisesRegex(RuntimeError, "invalid openreg stream id 12345"):
            torch.openreg.set_stream(torch.Stream(stream_id=12345, device_index=0, device_type=20))
        self.assertEqual(torch.openreg.current_stream(), torch.openreg.default_stream())
        self.assertEqual((torch.arange(3, device="openreg") + 1).cpu().tolist(), [1, 2, 3])

    def test_every_way_to_make_a_stream_current_refuses_a_made_up_pool_id(self):
        # torch.accelerator.set_stream and torch.Stream as a context reach the device guard's
        # exchangeStream (as c10::StreamGuard does), which took any stream id; every later op on the
        # thread then failed. torch.openreg's own calls also refuse an external handle that is not a
        # live stream of the device (another device's handle would escape this device's
        # synchronize); the guard takes those as they are, since a guard's destructor restores
        # through it and must not throw.
        other = torch.openreg.Stream(device=1).openreg_stream
        made_up = torch.Stream(stream_id=99, device_index=0, device_type=20)
        openreg_only = {
            "unknown or was destroyed": torch.Stream(stream_id=(1 << 40) + 7, device_index=0, device_type=20),
            f"openreg stream 0x{other:x} belongs to openreg device 1, not 0": torch.Stream(
                stream_id=other, device_index=0, device_type=20
            ),
        }
        ways = {
            "torch.openreg.set_stream": torch.openreg.set_stream,
            "with torch.openreg.stream": lambda s: torch.openreg.stream(s).__enter__(),
            "torch.accelerator.set_stream": torch.accelerator.set_stream,
            "with torch.Stream": lambda s: s.__enter__(),
        }
        cases = [("invalid openreg stream id 99", made_up, name, use) for name, use in ways.items()]
        cases += [(m, s, name, ways[name]) for m, s in openreg_only.items() for name in list(ways)[:2]]
        for message, stream, name, use in cases:
            with self.assertRaisesRegex(RuntimeError, message, msg=name):
                use(stream)
            # nothing changed: the device, the current streams, and the thread still works
            self.assertEqual(torch.openreg.current_device(), 0, msg=name)
            self.assertEqual(torch.openreg.current_stream(0), torch.openreg.default_stream(0), msg=name)
            self.assertEqual(torch.openreg.current_stream(1), torch.openreg.default_stream(1), msg=name)
            self.assertEqual((torch.arange(3, device="openreg") + 1).cpu().tolist(), [1, 2, 3])

    def test_raw_stream_handles(self):
        """The runtime handle that compiled code launches on: per stream, per device, following the
        thread's current stream; the C ABI (openregCurrentStream) answers the same, NULL for a bad device."""
        import ctypes

        import torch_openreg

        lib = ctypes.CDLL(torch_openreg.library_file("torch_openreg"))
        lib.openregCurrentStream.restype = ctypes.c_void_p
        lib.openregCurrentStream.argtypes = [ctypes.c_int]
        default0 = torch.openreg.default_stream(0).openreg_stream
        default1 = torch.openreg.default_stream(1).openreg_stream
        self.assertNotEqual(default0, 0)
        self.assertNotEqual(default0, default1)
        self.assertEqual(torch.openreg.current_raw_stream(), default0)
        self.assertEqual(torch.openreg.current_raw_stream(1), default1)
        self.assertEqual(lib.openregCurrentStream(-1), default0)
        s = torch.openreg.Stream(device=1)
        self.assertNotIn(s.openreg_stream, (default0, default1))
        with torch.openreg.stream(s):
            self.assertEqual(torch.openreg.current_raw_stream(), s.openreg_stream)
            self.assertEqual(lib.openregCurrentStream(-1), s.openreg_stream)
            self.assertEqual(lib.openregCurrentStream(0), default0)
        self.assertEqual(torch.openreg.current_raw_stream(1), default1)
        self.assertIsNone(lib.openregCurrentStream(99))
        with self.assertRaisesRegex(RuntimeError, "99"):
            torch.openreg.current_raw_stream(99)

    def test_stream_on_other_device_switches_device(self):
        s1 = torch.openreg.Stream(device=1)
        with torch.openreg.stream(s1):
            self.assertEqual(torch.openreg.current_device(), 1)
            x = torch.ones(3, device="openreg")
        self.assertEqual(torch.openreg.current_device(), 0)
        self.assertEqual(x.device, torch.device("openreg:1"))

    def test_current_stream_is_per_thread(self):
        s = torch.openreg.Stream()
        seen = []
        torch.openreg.set_stream(s)
        t = threading.Thread(target=lambda: seen.append(torch.openreg.current_stream()))
        t.start()
        t.join()
        torch.openreg.set_stream(torch.openreg.default_stream())
        self.assertEqual(seen, [torch.openreg.default_stream()])

    def test_work_is_asynchronous_and_query(self):
        s = torch.openreg.Stream()
        slow_work(512)  # a signature's first call is synchronous: made before the hold
        torch.openreg.synchronize()
        # Held, so that the check does not depend on the device being slower than the host: a call
        # that waited for the device would block until the hold times out, and the stream be idle.
        with torch.openreg.stream(s), StreamHold():
            a = slow_work(512)
            self.assertFalse(s.query())  # the host got here before the device finished
        s.synchronize()
        self.assertTrue(s.query())
        self.assertTrue(torch.isfinite(a).all().item())

    def test_synchronize_wakes_the_host_once(self):
        """A host asleep in synchronize() is woken when the queue it waits for is done, not after every
        kernel in it: each wake-up would take a core from the kernels still running."""
        s = torch.openreg.Stream()
        with torch.openreg.stream(s):
            a = torch.randn(256, 256, device="openreg")
            a = a @ a / 256  # a signature's first call is synchronous; the ones below are queued
            with StreamHold() as held:  # released far later than the host spins (2 ms at most): it sleeps
                for _ in range(200):
                    a = a @ a / 256
                threading.Timer(0.5, held.release).start()
                before = torch.openreg._runtime_counters()["wait_wakeups"]
                s.synchronize()
                woken = torch.openreg._runtime_counters()["wait_wakeups"] - before
        self.assertTrue(s.query())
        self.assertGreaterEqual(woken, 1)  # the host did go to sleep
        self.assertLessEqual(woken, 3)  # once, plus the odd spurious wake-up; not about 400

    def test_wait_stream_orders_work(self):
        s1, s2 = torch.openreg.Stream(), torch.openreg.Stream()
        a = torch.zeros(256, 256, device="openreg")
        with torch.openreg.stream(s1):
            slow_work(384)
            a.fill_(1.0)
        s2.wait_stream(s1)
        with torch.openreg.stream(s2):
            b = a * 2
        s2.synchronize()
        self.assertEqual(b.cpu(), torch.full((256, 256), 2.0))

    def test_side_stream_is_not_ordered_after_the_current_stream(self):
        # As on CUDA: a side stream does not wait for work queued on another stream unless told to.
        # The graph tests' warm-ups ran in-place work on a side stream without waiting for the fill
        # of its input on the default stream, and lost it whenever that fill ran late.
        s = torch.openreg.Stream()
        x = torch.zeros(16, device="openreg")
        x.fill_(5.0), x.add_(1)  # first calls of a signature run synchronously: not under the hold
        torch.openreg.synchronize()
        with StreamHold() as held:  # the current (default) stream is busy from here
            x.fill_(5.0)  # queued behind the hold
            with torch.openreg.stream(s):
                x.add_(1)  # not ordered after the fill: runs now
            s.synchronize()
            self.assertFalse(held.stream.query())
        torch.openreg.synchronize()
        self.assertEqual(x.cpu(), torch.full((16,), 5.0))  # the fill overwrote the add
        with StreamHold():
            x.fill_(5.0)
            s.wait_stream(torch.openreg.current_stream())  # ordered: s waits for the fill
            with torch.openreg.stream(s):
                x.add_(1)
        s.synchronize()
        self.assertEqual(x.cpu(), torch.full((16,), 6.0))

    def test_priorities(self):
        hi = torch.openreg.Stream(priority=-1)
        lo = torch.openreg.Stream(priority=0)
        self.assertNotEqual(hi, lo)
        self.assertEqual(torch.Stream(device="openreg", priority=-1).device_type, hi.device_type)
        self.assertEqual((hi.priority, lo.priority), (-1, 0))
        # As on CUDA: the range can be asked for, and values outside it are clamped to it.
        least, greatest = torch.openreg.Stream.priority_range()
        self.assertEqual((least, greatest), (0, -1))
        self.assertEqual(torch.openreg.Stream(priority=3).priority, least)
        self.assertEqual(torch.openreg.Stream(priority=-5).priority, greatest)
        # beyond 32 bits too (torch.Stream narrowed them first: 2**31 became a high priority)
        self.assertEqual(torch.openreg.Stream(priority=2**31).priority, least)
        self.assertEqual(torch.openreg.Stream(priority=-(2**40)).priority, greatest)

    def test_set_num_threads_reaches_kernels_on_every_stream(self):
        # Kernels run on the streams' workers, each with an OpenMP team of its own, sized when the
        # worker opened its first one; each launch now brings the host's intra-op thread count.
        before = torch.get_num_threads()
        x = _large()
        _team_size(x).cpu()  # a signature's first call runs synchronously: later ones are kernels
        side = torch.openreg.Stream()
        try:
            for n in (3, 1, 2):
                torch.set_num_threads(n)
                for stream in (torch.openreg.current_stream(), side):
                    with torch.openreg.stream(stream):
                        size, ident = _team_size(x).tolist()
                    self.assertNotEqual(ident, threading.get_ident())  # ran on the worker
                    self.assertEqual(size, n)
        finally:
            torch.set_num_threads(before)

    def test_host_threads_with_different_counts_each_get_theirs(self):
        # torch.set_num_threads sets the calling thread's count (and the one new threads start
        # with): a thread that started before it keeps its own. Kernels follow their launcher, and
        # the worker switching between counts leaves the count new threads start with alone.
        before = torch.get_num_threads()
        x = _large()
        _team_size(x).cpu()
        torch.set_num_threads(2)
        go, done = threading.Semaphore(0), threading.Semaphore(0)
        seen = {"other": [], "main": [], "new": None}

        def other():
            torch.get_num_threads()  # this thread's count is taken now: 2
            for _ in range(3):
                go.acquire()
                seen["other"].append(_team_size(x).tolist()[0])
                done.release()

        def new():
            seen["new"] = torch.get_num_threads()

        t = threading.Thread(target=other)
        t.start()
        try:
            torch.set_num_threads(1)
            for _ in range(3):  # the same stream's worker alternates between the two counts
                seen["main"].append(_team_size(x).tolist()[0])
                go.release()
                done.acquire()
            t.join()
            late = threading.Thread(target=new)  # the worker last took up the other thread's 2
            late.start()
            late.join()
        finally:
            for _ in range(3):  # lets the other thread finish if the loop above did not
                go.release()
            t.join()
            torch.set_num_threads(before)
        self.assertEqual(seen, {"other": [2, 2, 2], "main": [1, 1, 1], "new": 1})

    def test_small_kernels_run_on_one_thread(self):
        # A kernel whose tensor arguments (inputs and outputs) total less than the limit runs with
        # one intra-op thread; at the limit, with the launching thread's count.
        limit = torch_openreg._C._small_kernel_bytes()
        self.assertEqual(limit, 512 * 1024)  # the default (OPENREG_SMALL_KERNEL_BYTES unset)
        before = torch.get_num_threads()
        result = 2 * 8  # _team_size's output: two int64
        at_limit = torch.zeros((limit - result) // 4, device="openreg")
        under = torch.zeros((limit - result) // 4 - 1, device="openreg")
        tiny = torch.zeros(1, device="openreg")
        _team_size(tiny).cpu()
        try:
            for n in (2, 3):
                torch.set_num_threads(n)
                sizes = [_team_size(x).tolist()[0] for x in (tiny, under, at_limit, tiny)]
                self.assertEqual(sizes, [1, 1, n, 1])
                # A launch that counted no tensor (a compiled kernel's) keeps the host's count.
                self.assertEqual(raw_kernel_team_size(), n)
        finally:
            torch.set_num_threads(before)

    def test_arguments_dropped_before_a_launch_give_their_bytes_back(self):
        """A launch site (here a vendor's, built with OpenRegExtension) that builds its kernel
        arguments and then refuses the call or returns early leaves no count for the thread's next,
        unrelated launch; a launch takes the count of the arguments moved into it, and an argument
        dropped after another launch took its count gives nothing back."""
        import ctypes
        import tempfile

        from torch_openreg.utils.testing import compile_probe

        probe = """
            #include <ATen/Parallel.h>
            #include <ATen/core/Tensor.h>
            #include <atomic>
            #include <stdexcept>
            #include <vector>
            #include "torch_openreg/aten/OpenRegKernelTensor.h"
            using c10::openreg::KernelTensorArg;
            static std::atomic<int> team{0};
            extern "C" int last_team() { return team.load(); }
            static at::Tensor from(void* impl) {
              return at::Tensor(c10::intrusive_ptr<c10::TensorImpl>::reclaim_copy(static_cast<c10::TensorImpl*>(impl)));
            }
            // A kernel that keeps `args` and records its intra-op thread count.
            template <typename Args>
            static int launch(const at::Tensor& t, Args args) {
              return ::openreg::launch(c10::openreg::current_stream_handle(t.device().index()), "probe",
                                       [args = std::move(args)] { team = at::get_num_threads(); });
            }
            // Kernel arguments over `t` and `small` (openreg tensors, as TensorImpl*), then: 0 refuses
            // (throws), 1 returns without launching, 2 launches two over `t`, 3 launches a vector of
            // four grown one by one (the first over `t`), 4 launches a copy of one over `t` (which
            // keeps the original's count), counts one over `small`, drops the original, and launches
            // the one over `small`.
            extern "C" int build_then(void* t_impl, void* small_impl, int what) {
              const at::Tensor t = from(t_impl), small = from(small_impl);
              if (what == 3) {  // the vector's growth moves the first one twice
                std::vector<KernelTensorArg> v;
                for (int i = 0; i < 4; ++i) v.emplace_back(i == 0 ? t : small);
                return launch(t, std::move(v));
              }
              try {
                KernelTensorArg in(t), out(t);
                if (what == 0) throw std::runtime_error("refused after the arguments");
                if (what == 1) return 0;
                if (what == 2) return launch(t, std::make_pair(std::move(in), std::move(out)));
                std::optional<KernelTensorArg> original(std::move(in));
                if (int r = launch(t, KernelTensorArg(*original))) return r;
                KernelTensorArg last(small);
                original.reset();
                return launch(t, std::move(last));
              } catch (const std::runtime_error&) {
                return 1;
              }
            }
        """
        large = _large()  # would make the next raw kernel run with the whole team, n
        tiny = torch.zeros(1, device="openreg")  # would make it run on one thread
        before = torch.get_num_threads()
        with tempfile.TemporaryDirectory() as tmp:
            lib = compile_probe("openreg_launch_bytes_probe", probe, tmp)
            lib.build_then.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]

            def build_then(t: torch.Tensor, what: int) -> int:
                return lib.build_then(t._cdata, tiny._cdata, what)

            def launched_team(t: torch.Tensor, what: int) -> int:
                self.assertEqual(build_then(t, what), 0)
                torch.openreg.synchronize()
                return lib.last_team()

            torch.set_num_threads(2)
            try:
                for t in (large, tiny):
                    for what, returned in ((0, 1), (1, 0)):  # refused, returned early
                        # A large count left behind would give a small kernel the whole team ...
                        self.assertEqual(build_then(t, what), returned)
                        self.assertEqual(_team_size(tiny).tolist()[0], 1)
                        # ... and any count would give a kernel that counts nothing one thread.
                        self.assertEqual(build_then(t, what), returned)
                        self.assertEqual(raw_kernel_team_size(), 2)
                # Arguments moved into a launch (also through a growing vector) size that launch
                # only: a move carries the count.
                self.assertEqual([launched_team(t, 2) for t in (large, tiny)], [2, 1])
                self.assertEqual(raw_kernel_team_size(), 2)
                self.assertEqual(launched_team(large, 3), 2)
                # An argument dropped after a launch took its count takes nothing from the next
                # count (it would leave that one's bytes below zero: the whole team).
                self.assertEqual(launched_team(large, 4), 1)
                self.assertEqual(raw_kernel_team_size(), 2)
            finally:
                torch.set_num_threads(before)

    def test_small_kernel_limit_from_the_environment(self):
        code = """
            import torch, torch_openreg
            from test_streams import _team_size
            torch.set_num_threads(2)
            x = torch.zeros(1, device="openreg")
            _team_size(x).cpu()
            print(torch_openreg._C._small_kernel_bytes(), _team_size(x).tolist()[0])
        """
        r = run_python(code, env={"OPENREG_SMALL_KERNEL_BYTES": "0"})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), ["0", "2"])  # 0 turns the sizing off
        r = run_python(
            """
            import torch
            for _ in range(2):  # the device stays unusable, with the same error
                try:
                    torch.zeros(1, device="openreg")
                except RuntimeError as e:
                    print(e)
            """,
            env={"OPENREG_SMALL_KERNEL_BYTES": "64k"},
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.splitlines(), ["OPENREG_SMALL_KERNEL_BYTES must be a byte count, got '64k'"] * 2)
        self.assertNotIn("Warning", r.stderr)  # nothing said again at exit ("could not settle ...")

    def test_host_spins_while_the_kernels_leave_it_a_cpu(self):
        """A host waiting for the device spins on, instead of sleeping, while the running kernels leave
        it a CPU of its own (a sleeper pays a wake-up when they complete, 40 us on a VM), and spins
        with the interpreter released: a kernel written in Python runs meanwhile. With the
        interpreter held, the kernel below could not start before the host's spin gave up (1 s)."""
        code = """
            import time, torch
            from test_streams import _sleep_on_device
            x = torch.zeros(1, device="openreg")
            _sleep_on_device(x, 0.0).cpu()  # a signature's first call is synchronous
            before = torch.openreg._runtime_counters()["wait_wakeups"]
            _sleep_on_device(x, 0.05)  # one thread's kernel (a small one), far shorter than the spin
            t0 = time.perf_counter()
            torch.openreg.synchronize()
            took = time.perf_counter() - t0
            cpus = torch.openreg.get_device_properties().multi_processor_count  # the CPUs the runtime counts
            print(cpus, torch.openreg._runtime_counters()["wait_wakeups"] - before, took)
        """
        r = run_python(code, env={"OPENREG_WAIT_SPIN_US": "1000000"})
        self.assertEqual(r.returncode, 0, r.stderr)
        cpus, woken, took = r.stdout.split()
        self.assertGreaterEqual(float(took), 0.04)  # it did wait for the kernel
        self.assertLess(float(took), 0.9)  # and the kernel ran during the spin
        if int(cpus) >= 2:
            self.assertEqual(int(woken), 0)  # spun: never went to sleep

    def test_a_kernel_that_synchronizes_its_own_device_fails_instead_of_hanging(self):
        # A custom op's CPU body runs on the stream's worker; torch.openreg.synchronize() there waits
        # for that stream, which waited for itself forever. The runtime refuses the wait (as CUDA
        # refuses runtime calls from a host function on a stream): the kernel fails, and the next
        # synchronising call names it.
        r = run_python(
            """
            import torch

            @torch.library.custom_op("streamtest::syncs", mutates_args=(), device_types="cpu")
            def syncs(x: torch.Tensor, wait: bool) -> torch.Tensor:
                if wait:
                    torch.openreg.synchronize()
                return x + 1

            @syncs.register_fake
            def _(x, wait):
                return torch.empty_like(x)

            x = torch.arange(4.0, device="openreg")
            print(syncs(x, False).cpu().tolist())
            for call in range(2):  # a signature's first call is synchronous, the second queued
                try:
                    syncs(x, True).cpu()
                except RuntimeError as e:
                    print(call, "orErrorNotPermitted: orDeviceSynchronize was called from a kernel" in str(e))
            print(syncs(x, False).cpu().tolist())  # the stream still runs
            """,
            timeout=60,
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.splitlines(), ["[1.0, 2.0, 3.0, 4.0]", "0 True", "1 True", "[1.0, 2.0, 3.0, 4.0]"])


def _large() -> torch.Tensor:
    """A tensor whose kernels are not small (their tensor arguments reach the limit for one thread)."""
    return torch.zeros(torch_openreg._C._small_kernel_bytes() // 4, device="openreg")


@torch.library.custom_op("openreg_stream_test::sleep", mutates_args=(), device_types="cpu")
def _sleep_on_device(x: torch.Tensor, seconds: float) -> torch.Tensor:
    """On openreg, a kernel written in Python (it takes the interpreter lock) that sleeps."""
    time.sleep(seconds)
    return x.clone()


@_sleep_on_device.register_fake
def _(x, seconds):
    return torch.empty_like(x)  # with a fake kernel, calls after a signature's first are queued


@torch.library.custom_op("openreg_stream_test::team_size", mutates_args=(), device_types="cpu")
def _team_size(x: torch.Tensor) -> torch.Tensor:
    """On openreg, a kernel: the intra-op thread count of the thread it runs on, and that thread."""
    return torch.tensor([torch.get_num_threads(), threading.get_ident()], dtype=torch.int64)


@_team_size.register_fake
def _(x):
    return x.new_empty(2, dtype=torch.int64)


class TestEvents(TestCase):
    def test_query_unrecorded_and_record(self):
        e = torch.openreg.Event()
        self.assertTrue(e.query())
        with StreamHold():  # the record cannot run before the hold ends
            e.record()
            self.assertFalse(e.query())
        e.synchronize()
        self.assertTrue(e.query())

    def test_elapsed_time(self):
        start, end = torch.openreg.Event(enable_timing=True), torch.openreg.Event(enable_timing=True)
        start.record()
        slow_work()
        end.record()
        end.synchronize()
        self.assertGreater(start.elapsed_time(end), 0.0)

    def test_elapsed_time_errors(self):
        a, b = torch.openreg.Event(), torch.openreg.Event()
        a.record()
        b.record()
        b.synchronize()
        with self.assertRaisesRegex(RuntimeError, "timing enabled"):
            a.elapsed_time(b)
        c, d = torch.openreg.Event(enable_timing=True), torch.openreg.Event(enable_timing=True)
        with self.assertRaisesRegex(RuntimeError, "must be recorded"):
            c.elapsed_time(d)
        with self.assertRaisesRegex(ValueError, "Expected an openreg event, got an event of device cpu"):
            c.elapsed_time(torch.Event(device="cpu"))
        # the device still works
        self.assertEqual((torch.ones(2, device="openreg") + 1).cpu().tolist(), [2.0, 2.0])

    def test_stream_wait_event(self):
        s1, s2 = torch.openreg.Stream(), torch.openreg.Stream()
        x = torch.zeros(128, device="openreg")
        with torch.openreg.stream(s1):
            slow_work(384)
            x.add_(5)
            e = s1.record_event()
        s2.wait_event(e)
        with torch.openreg.stream(s2):
            y = x + 1
        # y was produced on s2: the default stream, which copies it to the host, must wait for it.
        torch.openreg.current_stream().wait_stream(s2)
        self.assertEqual(y.cpu(), torch.full((128,), 6.0))

    def test_dropping_recorded_events_does_not_wait(self):
        """Dropping an event recorded on a busy stream returns at once, as on CUDA (collective backends
        create and drop events per operation); waits already queued on it still hold."""
        with StreamHold() as held:
            busy = held.stream
            for _ in range(500):
                torch.Event(device="openreg").record()  # c10::Event, dropped at once
                busy.record_event()  # torch.openreg.Event
            waited = busy.record_event()
            other = torch.openreg.Stream()
            other.wait_event(waited)
            del waited
            with torch.openreg.stream(other):
                z = held.output + 1  # ordered after the held kernel by the dropped event
            self.assertFalse(busy.query())  # no drop waited for the held kernel
            self.assertFalse(other.query())
        other.synchronize()
        self.assertEqual(z.cpu(), torch.full((4,), 1.0))

    def test_record_into_full_queue_does_not_hold_the_gil(self):
        # A device kernel may be Python (the generic path runs a custom op's Python CPU kernel on the
        # stream's worker, which then takes the GIL). torch.Event.record holds the GIL while it
        # launches: if the queue is full, waiting for the worker with the GIL held never ends.
        r = run_python(
            """
            import time
            import torch

            delay = [0.0]

            @torch.library.custom_op("regress::py_sin", mutates_args=(), device_types="cpu")
            def py_sin(x: torch.Tensor) -> torch.Tensor:
                if delay[0]:
                    time.sleep(delay[0])  # the worker is busy while the host fills the queue
                    delay[0] = 0.0
                return x.sin()

            @py_sin.register_fake
            def _(x):
                return torch.empty_like(x)

            x = torch.randn(8, device="openreg")
            py_sin(x), py_sin(x)  # the first call of a signature is synchronous
            torch.openreg.synchronize()
            event = torch.Event(device="openreg")
            delay[0] = 0.5
            for _ in range(1500):  # more than the queue holds
                y = py_sin(x)
                event.record()  # two records a launch: some record finds the queue full while
                event.record()  # the item it waits for is a Python kernel
            torch.openreg.synchronize()
            print(torch.allclose(y.cpu(), x.cpu().sin()))
            """,
            timeout=60,
        )  # a hang raises subprocess.TimeoutExpired
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "True")

    def test_cross_device_copy_is_ordered(self):
        with torch.openreg.device(0):
            a = slow_work(384)
            a.fill_(3.0)
        b = a.to("openreg:1")
        self.assertEqual(b.device, torch.device("openreg:1"))
        self.assertEqual(b.cpu(), torch.full((384, 384), 3.0))


if __name__ == "__main__":
    run_tests()
