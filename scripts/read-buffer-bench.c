// How fast a cached file is read into a fresh anonymous buffer, by page size: the cost that
// src/model/buffer.rs avoids by advising transparent huge pages. Built and run by
// scripts/gpu-check.sh (stage sealedstart) on the GPU host; also runs anywhere with gcc.
//   read-buffer-bench FILE THREADS   -> one line per mode: 4 KiB pages, advised huge pages
// Each thread reads every THREADS-th 16 MiB block with pread, as ModelFiles::read_dir does.
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define BLOCK (16ul << 20)
#define HUGE (2ul << 20)

static size_t len;
static char* buf;
static int fd, threads;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void* reader(void* arg) {
    for (size_t off = (size_t)arg * BLOCK; off < len; off += threads * BLOCK) {
        size_t want = len - off < BLOCK ? len - off : BLOCK, done = 0;
        while (done < want) {
            ssize_t n = pread(fd, buf + off + done, want - done, off + done);
            if (n <= 0) {
                perror("pread");
                exit(1);
            }
            done += n;
        }
    }
    return NULL;
}

int main(int argc, char** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s FILE THREADS\n", argv[0]);
        return 2;
    }
    fd = open(argv[1], O_RDONLY);
    if (fd < 0) {
        perror(argv[1]);
        return 1;
    }
    len = lseek(fd, 0, SEEK_END);
    threads = atoi(argv[2]);
    for (int huge = 0; huge < 2; ++huge) {
        char* map = mmap(NULL, len + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (map == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        buf = (char*)(((size_t)map + HUGE - 1) & ~(HUGE - 1));
        if (huge) madvise(buf, len, MADV_HUGEPAGE);
        double t0 = now();
        pthread_t th[256];
        for (long i = 0; i < threads && i < 256; ++i) pthread_create(&th[i], NULL, reader, (void*)i);
        for (int i = 0; i < threads && i < 256; ++i) pthread_join(th[i], NULL);
        double t = now() - t0;
        printf("RESULT read into a fresh buffer, %s: %.2f GB in %.3f s = %.1f GB/s (%d threads)\n",
               huge ? "advised huge pages" : "4 KiB pages", len / 1e9, t, len / t / 1e9, threads);
        munmap(map, len + HUGE);
    }
    return 0;
}
