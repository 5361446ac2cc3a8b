module gpuready.local/pause

go 1.26.0
