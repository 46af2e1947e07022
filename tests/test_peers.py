"""mindgrpo/train/peers.py without MindSpore: the rank registry names a peer whose process ended, and SIGTERM raises,
restores the previous handler, and still ends a process that does not exit by itself."""
import signal
import subprocess
import sys
import textwrap

from mindgrpo.train import peers


def test_a_peer_whose_process_ended_is_named_and_a_live_one_is_not(tmp_path):
    peers.register(tmp_path, 0)
    subprocess.run([sys.executable, "-c", f"from mindgrpo.train import peers; peers.register({str(tmp_path)!r}, 1)"],
                   check=True)
    gone = peers.lost_peers(tmp_path, rank=0, world_size=2)
    assert [p["rank"] for p in gone] == [1]
    assert peers.lost_peers(tmp_path, rank=1, world_size=2) == []  # rank 0 (this process) is alive
    assert peers.describe_lost(gone, 0).startswith(f"rank 1 (pid {gone[0]['pid']} on ")


def test_sigterm_raises_then_the_process_exits_after_the_grace(tmp_path):
    script = textwrap.dedent(f"""
        import os, signal, time
        from mindgrpo.train import peers
        before = signal.getsignal(signal.SIGTERM)
        try:
            with peers.sigterm_raises({str(tmp_path)!r}, rank=0, world_size=2, grace=1):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30)
        except peers.Terminated as err:
            print("raised:", err, flush=True)
        assert signal.getsignal(signal.SIGTERM) is before
        time.sleep(30)  # a process that carries on after SIGTERM is ended by the watchdog
        print("not ended", flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=25)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert "raised: SIGTERM received by rank 0" in done.stdout and "not ended" not in done.stdout
    assert "still running 1 s after SIGTERM" in done.stderr
