"""Point-to-point on 3 ranks: a ring with batch_isend_irecv, a 1F1B pipeline smoke test,
operations with two peers at once on per-peer streams, sends that never hold back the receive after
them, and small sends that end once staged (with the staged copies bounded)."""

import time

import torch
import torch.distributed as dist
from conftest import OcclTestCase
from torch.testing._internal.common_utils import run_tests


def ends_within(work, seconds):
    """Whether ``work`` completes within ``seconds`` (polled: a wait could block until the timeout)."""
    deadline = time.monotonic() + seconds
    while not work.is_completed() and time.monotonic() < deadline:
        time.sleep(0.01)
    return work.is_completed()


class TestP2P(OcclTestCase):
    world_size = 3

    def test_a_send_in_flight_keeps_its_input_when_its_group_is_destroyed(self):
        # The backend dropped its in-flight Works with it: the input of a send the peer had not
        # received yet went back to the allocator, the sender's next tensor took its block, and the
        # peer received that tensor's values. Inputs are recorded on the comm stream, as NCCL's.
        group = dist.new_group([0, 1])
        n = 1 << 18  # 1 MiB: not staged, the transport reads the tensor when the peer receives
        if self.rank == 0:
            x = torch.full((n,), 1.0, device=self.device)
            ptr = x.data_ptr()
            dist.isend(x, 1, group=group)  # its Work dropped at once
            del x
            dist.destroy_process_group(group)
            y = torch.full((n,), 99.0, device=self.device)
            self.assertNotEqual(y.data_ptr(), ptr)
            dist.barrier()  # rank 1 receives now
        elif self.rank == 1:
            dist.barrier()
            got = torch.zeros(n, device=self.device)
            dist.recv(got, 0, group=group)
            self.assertEqual(got.cpu(), torch.ones(n))
            dist.destroy_process_group(group)
        else:  # not in the group
            dist.barrier()
        dist.barrier()

    def test_ring(self):
        nxt, prv = (self.rank + 1) % 3, (self.rank - 1) % 3
        for n in (4, 1 << 16):
            mine = torch.full((n,), float(self.rank), device=self.device)
            got = torch.empty(n, device=self.device)
            ops = [dist.P2POp(dist.isend, mine, nxt), dist.P2POp(dist.irecv, got, prv)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            self.assertEqual(got.cpu(), torch.full((n,), float(prv)))

    def test_peers_do_not_block_each_other(self):
        # Rank 2 waits for rank 0 first, whose value comes from rank 1 only after rank 1's send to
        # rank 2: a receive from one peer must not hold back the receive from another (nor a send
        # to one peer the send to another). With one stream for all receives this deadlocked.
        for dev in (torch.device("cpu"), self.device):  # Gloo on CPU, then occl: the same results
            x = torch.full((4,), 10.0 + self.rank, device=dev)
            if self.rank == 2:
                a, b = torch.empty(4, device=dev), torch.empty(4, device=dev)
                works = [dist.irecv(a, src=0), dist.irecv(b, src=1)]
                for w in works:
                    w.wait()
                self.assertEqual(a.cpu(), torch.full((4,), 111.0))
                self.assertEqual(b.cpu(), torch.full((4,), 11.0))
            elif self.rank == 1:
                dist.send(x, dst=2)
                dist.send(x, dst=0)
            else:
                z = torch.empty(4, device=dev)
                dist.recv(z, src=1)
                dist.send(z + 100, dst=2)
                self.assertEqual(z.cpu(), torch.full((4,), 11.0))
        # The same inside a coalescing manager, every rank posting its receives before its sends
        # (a batch's receives do not hold back its sends), small (staged) and large: its Work ends
        # after every per-peer stream it used.
        for n in (4, 1 << 18):
            got = {p: torch.empty(n, device=self.device) for p in range(3) if p != self.rank}
            mine = torch.full((n,), float(self.rank), device=self.device)
            with dist._coalescing_manager(device=self.device, async_ops=True) as cm:
                for p in got:
                    dist.irecv(got[p], src=p)
                for p in got:
                    dist.isend(mine, dst=p)
            cm.wait()
            for p, g in got.items():
                self.assertEqual(g.cpu(), torch.full((n,), float(p)))

    def test_both_ranks_send_first(self):
        # A send never holds back the receive posted after it on its peer's stream, staged or not
        # (8 B and 1 MiB): both ranks send, then receive.
        if self.rank == 2:
            return
        peer = 1 - self.rank
        for n in (2, 1 << 18):
            x = torch.full((n,), float(self.rank), device=self.device)
            got = torch.empty(n, device=self.device)
            works = [dist.isend(x, peer), dist.irecv(got, peer)]
            for w in works:
                w.wait()
            self.assertEqual(got.cpu(), torch.full((n,), float(peer)))

    def test_small_sends_end_once_staged(self):
        # A send of up to 64 KiB is copied when it starts: its Work ends before the peer receives,
        # and the sender may overwrite the tensor at once. A larger one ends once the peer took it.
        stream = torch.openreg.current_stream(self.device)
        for n in (16, (64 << 10) // 4 + 1):  # 64 B, and 4 B over the limit
            want = torch.arange(n, dtype=torch.float32)
            if self.rank == 0:
                x = want.to(self.device)
                w = dist.isend(x, dst=1)
                if n == 16:
                    # Staged: its Work ends once its start ran (polled: an unstaged one would end
                    # only after the barrier, and a synchronize would then wait until the timeout).
                    self.assertTrue(ends_within(w, 30.0))
                    w.wait()
                    x.fill_(-1.0)  # ordered after the Work's end on the current stream
                else:
                    # A staged send's Work would complete as soon as its start ran (well within 1 s);
                    # this one cannot before rank 1 receives, after the barrier.
                    self.assertFalse(ends_within(w, 1.0))
                dist.barrier()
                w.wait()
                stream.synchronize()
                self.assertTrue(w.is_completed())
            else:
                dist.barrier()
                if self.rank == 1:
                    got = torch.empty(n, device=self.device)
                    dist.recv(got, src=0)
                    self.assertEqual(got.cpu(), want)

    def test_staged_copies_are_bounded(self):
        # A producer far ahead of a peer that does not receive yet: 80 sends of 64 KiB to rank 1,
        # 5 MiB in all. The first 4 MiB (64 sends) are staged (copied into host memory the transport
        # owns) and end at once; the rest are not, and end at delivery, so the copies waiting for
        # delivery stay at 4 MiB per peer. The budget is rank 1's: a small send to rank 2 meanwhile
        # is staged. Once delivered, the budget is free again: the next small send is staged.
        count, n = 80, (64 << 10) // 4
        staged = (4 << 20) // (n * 4)

        if self.rank == 0:
            xs = [torch.full((n,), float(i), device=self.device) for i in range(count)]
            works = [dist.isend(x, dst=1) for x in xs]
            to_rank2 = ends_within(dist.isend(xs[1], dst=2), 30.0)
            last = ends_within(works[-1], 1.0)
            staged_ended = all(ends_within(w, 30.0) for w in works[:staged])  # end without a receive
            pending = [i for i, w in enumerate(works) if not w.is_completed()]  # the rest: only after the barrier
            dist.barrier()
            for w in works:
                w.wait()
            torch.openreg.synchronize(self.device)  # the send completions: the reservations are freed
            again = ends_within(dist.isend(xs[0], dst=1), 30.0)  # before rank 1's receive (the barrier)
            dist.barrier()
            self.assertTrue(to_rank2, "a small send to rank 2 was not staged")
            self.assertFalse(last)
            self.assertTrue(staged_ended, "the first 4 MiB of sends were not staged")
            self.assertEqual(pending, list(range(staged, count)))  # only the first 4 MiB were copied
            self.assertTrue(again, "the next small send after delivery was not staged")
        else:
            dist.barrier()
            got = torch.empty(n, device=self.device)
            if self.rank == 1:
                for i in range(count):
                    dist.recv(got, src=0)
                    self.assertEqual(got.cpu(), torch.full((n,), float(i)))
            else:
                dist.recv(got, src=0)
                self.assertEqual(got.cpu(), torch.ones(n))
            dist.barrier()
            if self.rank == 1:
                dist.recv(got, src=0)
                self.assertEqual(got.cpu(), torch.zeros(n))

    def test_sends_to_a_peer_end_in_order(self):
        # No send is staged while an unstaged one to the same peer is not delivered: waiting for the
        # last send covers the earlier ones (as on NCCL's one stream per peer), and the sender may
        # then reuse every buffer. A large send, then a small one, rank 1 receiving after a barrier.
        if self.rank == 2:
            dist.barrier()
            return
        big, small = (1 << 18), 16
        if self.rank == 0:
            a = torch.full((big,), 1.0, device=self.device)
            b = torch.full((small,), 2.0, device=self.device)
            wa, wb = dist.isend(a, dst=1), dist.isend(b, dst=1)
            time.sleep(0.5)
            ended = (wa.is_completed(), wb.is_completed())
            dist.barrier()
            wb.wait()
            torch.openreg.current_stream(self.device).synchronize()  # both delivered now
            self.assertEqual(ended, (False, False))
            self.assertTrue(wa.is_completed())
        else:
            dist.barrier()
            x, y = torch.empty(big, device=self.device), torch.empty(small, device=self.device)
            dist.recv(x, src=0)
            dist.recv(y, src=0)
            self.assertEqual((x.cpu().unique().tolist(), y.cpu().unique().tolist()), ([1.0], [2.0]))

    def test_1f1b_pipeline(self):
        # Stage s adds s + 1 in "forward"; "backward" doubles the gradient per stage. 1F1B steady
        # state: each stage sends a forward activation and receives a gradient in one batch.
        stages, micro = 3, 4
        s = self.rank
        warmup = min(stages - s - 1, micro)
        fwd_done, grads = [], []

        def forward(m):
            x = torch.full((8,), float(m), device=self.device)
            if s > 0:
                dist.recv(x, s - 1)
            y = x + (s + 1)
            fwd_done.append(y)
            return y

        def send_fwd_recv_grad(y):
            if s == stages - 1:
                return torch.ones_like(y)  # the last stage's loss gradient
            g = torch.empty_like(y)
            ops = [dist.P2POp(dist.isend, y, s + 1), dist.P2POp(dist.irecv, g, s + 1)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            return g

        def backward(g):
            g = g * 2
            grads.append(g)
            if s > 0:
                dist.send(g, s - 1)

        pending = []
        for m in range(warmup):
            y = forward(m)
            if s < stages - 1:
                dist.send(y, s + 1)
            pending.append(m)
        for m in range(warmup, micro):
            y = forward(m)
            backward(send_fwd_recv_grad(y))
        for _ in range(warmup):
            g = torch.empty(8, device=self.device)
            dist.recv(g, s + 1)
            backward(g)
        # Forward: stage s saw microbatch m plus 1 + ... + (s + 1); backward: 2 ** (stages - s).
        for m, y in enumerate(fwd_done):
            self.assertEqual(y.cpu(), torch.full((8,), float(m + (s + 1) * (s + 2) // 2)))
        for g in grads:
            self.assertEqual(g.cpu(), torch.full((8,), float(2 ** (stages - s))))
        self.assertEqual(len(grads), micro)


if __name__ == "__main__":
    run_tests()
