import { Module } from '@nestjs/common';
import { SequenceModule } from 'nest-sequence';
import { ImagingModule } from './imaging/imaging.module';

/** The demo on the embedded defaults: in-memory transport and store, no server needed. */
@Module({
  imports: [SequenceModule.forRoot({ isGlobal: true }), ImagingModule],
})
export class AppModule {}
