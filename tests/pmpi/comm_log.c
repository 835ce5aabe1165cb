/* A PMPI interposer, as a user would write one: every MPI_Send and MPI_Recv is logged
 * with the name and topology of the communicator it travels on, then passed on to
 * PMPI_*. Loaded with LD_PRELOAD; each rank appends to $COMM_LOG_DIR/rank<world>.log.
 * Build: mpicc -shared -fPIC -o libcomm_log.so comm_log.c */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static FILE *out;

static void note(const char *op, MPI_Comm comm, int peer, int tag) {
    if (!out) {
        int me;
        char path[4096];
        const char *dir = getenv("COMM_LOG_DIR");
        PMPI_Comm_rank(MPI_COMM_WORLD, &me);
        snprintf(path, sizeof path, "%s/rank%d.log", dir ? dir : ".", me);
        out = fopen(path, "a");
        if (!out) return;
    }
    char name[MPI_MAX_OBJECT_NAME] = "";
    int len = 0, kind = MPI_UNDEFINED, size = 0;
    PMPI_Comm_get_name(comm, name, &len);
    PMPI_Topo_test(comm, &kind);
    PMPI_Comm_size(comm, &size);
    const char *topo = kind == MPI_CART ? "cart" : kind == MPI_DIST_GRAPH ? "distgraph"
                     : kind == MPI_GRAPH ? "graph" : "none";
    int ndims = 0, dims[8] = {0}, periods[8], coords[8];
    if (kind == MPI_CART) {
        PMPI_Cartdim_get(comm, &ndims);
        if (ndims <= 8) PMPI_Cart_get(comm, ndims, dims, periods, coords);
    }
    fprintf(out, "%s comm=%s topo=%s size=%d dims=%dx%d peer=%d tag=%d\n", op,
            len ? name : "?", topo, size, dims[0], ndims > 1 ? dims[1] : 1, peer, tag);
    fflush(out);
}

int MPI_Send(const void *buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm) {
    note("send", comm, dest, tag);
    return PMPI_Send(buf, count, type, dest, tag, comm);
}

int MPI_Recv(void *buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm,
             MPI_Status *status) {
    note("recv", comm, source, tag);
    return PMPI_Recv(buf, count, type, source, tag, comm, status);
}

/* mpi4py calls the large-count forms where the library has them (MPI 4). */
int MPI_Send_c(const void *buf, MPI_Count count, MPI_Datatype type, int dest, int tag,
               MPI_Comm comm) {
    note("send", comm, dest, tag);
    return PMPI_Send_c(buf, count, type, dest, tag, comm);
}

int MPI_Recv_c(void *buf, MPI_Count count, MPI_Datatype type, int source, int tag,
               MPI_Comm comm, MPI_Status *status) {
    note("recv", comm, source, tag);
    return PMPI_Recv_c(buf, count, type, source, tag, comm, status);
}
