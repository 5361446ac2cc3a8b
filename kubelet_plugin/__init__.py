"""The node daemon: registration, NodePrepare/Unprepare, CDI, checkpoint, ResourceSlice publishing."""
